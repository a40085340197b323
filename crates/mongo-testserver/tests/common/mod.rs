//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use mongo_testserver::TestServer;
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::ClientOptions;
use mongodb::Client;

/// A client for `server` (optionally with an app name).
pub async fn client(server: &TestServer) -> Client {
    client_named(server, None).await
}

/// A client with `app_name`.
pub async fn client_named(server: &TestServer, app_name: Option<&str>) -> Client {
    let mut opts = ClientOptions::parse(server.uri())
        .await
        .expect("uri parses");
    opts.app_name = app_name.map(str::to_owned);
    opts.server_selection_timeout = Some(Duration::from_secs(5));
    Client::with_options(opts).expect("client")
}

/// The server error code inside a driver error.
pub fn code(err: &mongodb::error::Error) -> Option<i32> {
    match &*err.kind {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        ErrorKind::InsertMany(e) => e
            .write_errors
            .as_ref()
            .and_then(|w| w.first())
            .map(|w| w.code),
        _ => None,
    }
}
