//! The `serde` feature: what `inspect`, `list` and `holders` return serializes with the field
//! names the lock documents and the CLI's `--json` use, times as RFC 3339 strings.

use std::time::Duration;

use mongolock::LockProvider;

#[tokio::test]
async fn lock_info_and_holders_serialize_with_stable_names() {
    let provider = LockProvider::builder(mongolock::MemoryBackend::new())
        .app_name("nightly report")
        .expiry(Duration::from_secs(30))
        .build()
        .unwrap();
    let g = provider.lock("door").unwrap().acquire().await.unwrap();
    let info = provider.inspect("door").await.unwrap().expect("a record");
    let v = serde_json::to_value(&info).unwrap();
    assert_eq!(v["name"], "door", "{v}");
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["fencing_token"], g.fencing_token(), "{v}");
    assert_eq!(v["lease_id"], g.lease_id().as_str(), "{v}");
    assert_eq!(v["holder"]["app"], "nightly report", "{v}");
    assert_eq!(v["holder"]["pid"], std::process::id(), "{v}");
    for time in ["acquired_at", "expires_at", "observed_at"] {
        let s = v[time]
            .as_str()
            .unwrap_or_else(|| panic!("{time} is not a string: {v}"));
        let parsed = humantime::parse_rfc3339(s).unwrap_or_else(|e| panic!("{time} {s}: {e}"));
        assert!(parsed > std::time::UNIX_EPOCH, "{time} {s}");
    }
    let holders = provider.holders("door").await.unwrap();
    let h = serde_json::to_value(&holders).unwrap();
    assert_eq!(h[0]["fencing_token"], g.fencing_token(), "{h}");
    assert_eq!(h[0]["holder"]["app"], "nightly report", "{h}");
    g.release().await.unwrap();
    let info = provider.inspect("door").await.unwrap().expect("a record");
    let v = serde_json::to_value(&info).unwrap();
    assert_eq!(v["held"], false, "{v}");
    assert!(v["lease_id"].is_null(), "released: {v}");
}
