//! A login attempt gets a clear answer: the test server has no users, so a client with
//! credentials in its URI is told that authentication is not supported and to connect without
//! them (instead of an unknown-command error about `saslStart`). Through the official driver
//! over TCP, for each mechanism the driver can try against the server.

mod common;

use std::time::Duration;

use bson::doc;
use mongo_testserver::TestServer;
use mongodb::error::ErrorKind;
use mongodb::options::ClientOptions;
use mongodb::Client;

const ADVICE: &str = "authentication is not supported by mongo-testserver; connect without \
                      credentials (remove the user:password from the URI)";

/// A client for `uri` that gives up quickly when the server cannot be selected.
async fn client_for(uri: &str) -> Client {
    let mut opts = ClientOptions::parse(uri).await.expect("uri parses");
    opts.server_selection_timeout = Some(Duration::from_secs(10));
    Client::with_options(opts).expect("client")
}

/// `server`'s URI (`mongodb://HOST/?directConnection=true`) with `user:secret@` and the
/// extra options `query` (`authMechanism=..`).
fn uri_with_credentials(server: &TestServer, query: &str) -> String {
    let uri = server.uri().replace("mongodb://", "mongodb://user:secret@");
    assert!(
        uri.contains("/?"),
        "the test server's URI has options: {uri}"
    );
    if query.is_empty() {
        uri
    } else {
        format!("{uri}&{query}")
    }
}

#[tokio::test]
async fn a_client_with_credentials_is_told_to_connect_without_them() {
    let server = TestServer::start().await.expect("start the test server");
    // The driver's default (SCRAM-SHA-256 speculatively in the handshake, then saslStart), the
    // older SCRAM, and PLAIN (saslStart with the password).
    for query in [
        "",
        "authMechanism=SCRAM-SHA-256",
        "authMechanism=SCRAM-SHA-1",
        "authMechanism=PLAIN&authSource=$external",
    ] {
        let uri = uri_with_credentials(&server, query);
        let client = client_for(&uri).await;
        let err = client
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .expect_err(&format!("ping with credentials ({uri}) must fail"));
        let message = err.to_string();
        assert!(
            message.contains(ADVICE),
            "{uri}: the error does not say to connect without credentials: {message}"
        );
        assert!(
            matches!(*err.kind, ErrorKind::Authentication { .. }),
            "{uri}: not an authentication error: {err:?}"
        );
    }

    // The same server still serves a client without credentials.
    let client = common::client(&server).await;
    client
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .expect("ping without credentials");
}

#[tokio::test]
async fn each_login_command_is_refused_with_the_advice_and_authentication_failed() {
    let server = TestServer::start().await.expect("start the test server");
    let client = common::client(&server).await;
    let commands = [
        doc! { "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic, bytes: b"n,,n=user,r=abc".to_vec() } },
        doc! { "saslContinue": 1, "conversationId": 1, "payload": bson::Binary {
        subtype: bson::spec::BinarySubtype::Generic, bytes: Vec::new() } },
        doc! { "authenticate": 1, "mechanism": "MONGODB-X509" },
    ];
    for (db, cmd) in [
        ("admin", &commands[0]),
        ("admin", &commands[1]),
        ("$external", &commands[2]),
    ] {
        let err = client
            .database(db)
            .run_command(cmd.clone())
            .await
            .expect_err(&format!("{cmd} must fail"));
        match &*err.kind {
            ErrorKind::Command(c) => {
                assert_eq!(c.code, 18, "{cmd}: code {} ({})", c.code, c.message);
                assert_eq!(c.code_name, "AuthenticationFailed", "{cmd}: {c:?}");
                assert!(c.message.contains(ADVICE), "{cmd}: {}", c.message);
            }
            other => panic!("{cmd}: not a command error: {other:?}"),
        }
    }
}
