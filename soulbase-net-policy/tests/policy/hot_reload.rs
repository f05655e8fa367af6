//! Hot reload: readers always see a whole, valid snapshot; invalid updates never show.

use std::sync::atomic::{AtomicBool, Ordering};

use soulbase_net_policy::*;

/// Marks every field an invalid update sets; readers must never see it.
const POISON: u32 = 999_999;
const UPDATES: u64 = 200;
const READERS: usize = 8;

/// A valid document where three fields in three layers carry generation `g`.
fn valid(g: u32) -> String {
    format!(
        r#"
        [default]
        limits.per_host_concurrency = {g}
        [overrides."*.example.com"]
        cache.max_entries = {g}
        [tenants.t1.overrides."api.example.com"]
        limits.per_tenant_concurrency = {g}
        "#
    )
}

/// An invalid document (zero attempts) that also sets the poison marker.
fn invalid() -> String {
    format!(
        r#"
        [default]
        limits.per_host_concurrency = {POISON}
        [overrides."*.example.com"]
        cache.max_entries = {POISON}
        retry.max_attempts = 0
        "#
    )
}

fn generation(p: &NetPolicy) -> u32 {
    let g = p.limits.per_host_concurrency;
    assert_ne!(g, POISON, "an invalid update became visible");
    assert_eq!(u64::from(g), p.cache.max_entries, "a torn snapshot");
    assert_eq!(g, p.limits.per_tenant_concurrency, "a torn snapshot");
    g
}

#[test]
fn readers_see_whole_valid_snapshots_while_updates_land() {
    let r = SnapshotResolver::new(PolicyDocument::from_toml_str(&valid(1)).unwrap()).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for reader in 0..READERS {
            let (r, done) = (&r, &done);
            s.spawn(move || {
                let (mut last_gen, mut last_version, mut reads) = (0, 0, 0u64);
                // Bounded: the writer finishes after 200 updates; the cap guards a hang.
                while reads < 2_000_000 && (reads < 100 || !done.load(Ordering::Acquire)) {
                    let version = r.version();
                    assert!(version >= last_version, "versions went back");
                    last_version = version;
                    let host = if reads % 2 == 0 {
                        "api.example.com"
                    } else {
                        "API.example.com."
                    };
                    let p = r.resolve(Some("t1"), host);
                    let g = generation(&p);
                    assert!(g >= last_gen, "reader {reader}: generation went back");
                    last_gen = g;
                    if reads % 256 == 0 {
                        p.validate().unwrap();
                        let snap = r.snapshot();
                        let sg = generation(&snap.resolve(Some("t1"), "api.example.com"));
                        assert_eq!(
                            u64::from(sg),
                            snap.version(),
                            "version and content disagree"
                        );
                    }
                    reads += 1;
                    // Two cores, eight readers: let the writer in now and then.
                    if reads % 16 == 0 {
                        std::thread::yield_now();
                    }
                }
                assert!(reads >= 100);
            });
        }

        let mut version = r.version();
        for i in 0..UPDATES {
            if i % 2 == 0 {
                let g = u32::try_from(version + 1).unwrap();
                let v = if i % 4 == 0 {
                    r.update_toml_str(&valid(g)).unwrap()
                } else {
                    r.update(PolicyDocument::from_toml_str(&valid(g)).unwrap())
                        .unwrap()
                };
                assert_eq!(v, version + 1);
                version = v;
            } else {
                let e = r.update_toml_str(&invalid()).unwrap_err();
                assert!(e.to_string().contains("retry.max_attempts"), "{e}");
                assert_eq!(
                    r.version(),
                    version,
                    "a rejected update changed the version"
                );
            }
        }
        done.store(true, Ordering::Release);
    });
    assert_eq!(r.version(), 1 + UPDATES / 2);
    assert_eq!(
        u64::from(generation(&r.resolve(Some("t1"), "api.example.com"))),
        r.version()
    );
}

#[test]
fn reload_from_file_accepts_valid_and_keeps_the_old_on_invalid() {
    let path = std::env::temp_dir().join(format!(
        "soulbase-policy-reload-{}-{:?}.toml",
        std::process::id(),
        std::thread::current().id()
    ));
    struct Cleanup<'a>(&'a std::path::Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _cleanup = Cleanup(&path);

    std::fs::write(&path, valid(1)).unwrap();
    let r = SnapshotResolver::from_path(&path).unwrap();
    assert_eq!(generation(&r.resolve(Some("t1"), "api.example.com")), 1);

    std::fs::write(&path, valid(2)).unwrap();
    assert_eq!(r.reload_from_file(&path).unwrap(), 2);
    assert_eq!(generation(&r.resolve(Some("t1"), "api.example.com")), 2);

    std::fs::write(&path, invalid()).unwrap();
    let e = r.reload_from_file(&path).unwrap_err();
    assert!(
        e.to_string()
            .contains(r#"overrides."*.example.com".retry.max_attempts"#),
        "{e}"
    );
    assert_eq!(r.version(), 2);
    assert_eq!(generation(&r.resolve(Some("t1"), "api.example.com")), 2);

    std::fs::write(&path, "not = [valid").unwrap();
    assert!(r.reload_from_file(&path).is_err());
    std::fs::remove_file(&path).unwrap();
    assert!(r
        .reload_from_file(&path)
        .unwrap_err()
        .to_string()
        .contains("cannot read"));
    assert_eq!(r.version(), 2);
}

#[test]
fn json_updates_work_too() {
    let r = SnapshotResolver::default();
    let v = r
        .update_json_str(r#"{"default": {"limits": {"per_host_concurrency": 5}}}"#)
        .unwrap();
    assert_eq!(v, 2);
    assert_eq!(r.resolve(None, "x.org").limits.per_host_concurrency, 5);
    assert!(r
        .update_json_str(r#"{"default": {"limits": {"per_host_concurrency": 0}}}"#)
        .is_err());
    assert_eq!(r.version(), 2);
}
