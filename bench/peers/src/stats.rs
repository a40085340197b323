//! What the server says about itself (`serverStatus`), and memory/CPU of processes (Linux
//! `/proc`).

use mongodb::bson::{doc, Bson, Document};
use mongodb::Client;

/// Counters from one `serverStatus`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerStats {
    /// Commands received, except the driver's monitoring (`hello`/`isMaster`) and our own
    /// `serverStatus` probes.
    pub commands: u64,
    pub find_and_modify: u64,
    pub get_more: u64,
    pub update: u64,
    /// Change-stream cursors open (mongo-testserver's `metrics.cursor.open.changeStreams`;
    /// `None` on a server that does not report it).
    pub change_streams: Option<u64>,
    pub cursors: u64,
    pub connections: u64,
}

fn as_u64(v: Option<&Bson>) -> u64 {
    match v {
        Some(Bson::Int32(i)) => *i as u64,
        Some(Bson::Int64(i)) => *i as u64,
        Some(Bson::Double(d)) => *d as u64,
        _ => 0,
    }
}

fn path<'a>(d: &'a Document, p: &[&str]) -> Option<&'a Bson> {
    let (last, init) = p.split_last()?;
    let mut cur = d;
    for k in init {
        cur = cur.get_document(k).ok()?;
    }
    cur.get(last)
}

/// Reads the server's counters (through `admin`, a client used for nothing else).
pub async fn server_stats(admin: &Client) -> ServerStats {
    let s = admin
        .database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await
        .expect("serverStatus");
    let mut out = ServerStats::default();
    if let Some(Bson::Document(cmds)) = path(&s, &["metrics", "commands"]) {
        for (name, v) in cmds {
            let total = v.as_document().map_or(0, |d| as_u64(d.get("total")));
            match name.as_str() {
                "hello" | "isMaster" | "ismaster" | "serverStatus" => {}
                _ => out.commands += total,
            }
            match name.as_str() {
                "findAndModify" => out.find_and_modify = total,
                "getMore" => out.get_more = total,
                "update" => out.update = total,
                _ => {}
            }
        }
    }
    out.change_streams =
        path(&s, &["metrics", "cursor", "open", "changeStreams"]).map(|v| as_u64(Some(v)));
    out.cursors = as_u64(path(&s, &["metrics", "cursor", "open", "total"]));
    out.connections = as_u64(path(&s, &["connections", "current"]));
    out
}

/// Resident set size of process `pid` in bytes (`/proc/<pid>/status`, Linux).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
