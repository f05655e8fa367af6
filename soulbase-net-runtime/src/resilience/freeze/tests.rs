use std::net::IpAddr;

use super::*;

const MIN: Duration = Duration::from_secs(60);

fn urls() -> Vec<String> {
    [
        "https://a.example",
        "https://b.example",
        "https://c.example",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn a_frozen_url_is_skipped_and_thaws_after_the_duration() {
    let f = Freezer::new(100);
    let u = urls();
    let t0 = Instant::now();
    f.freeze(&u[0], 10 * MIN, t0);
    assert!(f.is_frozen(&u[0], t0));
    assert_eq!(f.choose(&u, t0), u[1..]);
    assert_eq!(
        f.choose(&u, t0 + 10 * MIN - Duration::from_millis(1)),
        u[1..]
    );
    let t1 = t0 + 10 * MIN;
    assert!(!f.is_frozen(&u[0], t1));
    assert_eq!(f.choose(&u, t1), u);
    assert_eq!(f.len(), 0, "thawed entries are dropped");
}

#[test]
fn all_frozen_picks_the_earliest_thaw() {
    let f = Freezer::new(100);
    let u = urls();
    // Ahead of the real clock, so going back 5 minutes cannot underflow.
    let t0 = Instant::now() + 10 * MIN;
    f.freeze(&u[0], 10 * MIN, t0);
    f.freeze(&u[1], 10 * MIN, t0 - 5 * MIN);
    f.freeze(&u[2], 10 * MIN, t0 - MIN);
    assert_eq!(f.choose(&u, t0), [u[1].clone()]);
    // b thaws at t0 + 5min: then it alone is open.
    assert_eq!(f.choose(&u, t0 + 5 * MIN), [u[1].clone()]);
    assert!(!f.is_frozen(&u[1], t0 + 5 * MIN));
    assert!(f.is_frozen(&u[2], t0 + 5 * MIN));
    assert!(f.choose(&[], t0).is_empty());
}

#[test]
fn refreezing_keeps_the_later_thaw() {
    let f = Freezer::new(100);
    let t0 = Instant::now();
    f.freeze(&1u8, 10 * MIN, t0);
    f.freeze(&1u8, MIN, t0);
    assert!(f.is_frozen(&1u8, t0 + 5 * MIN));
}

#[test]
fn frozen_ip_addresses_are_skipped_in_order() {
    let f = Freezer::new(100);
    let ips: Vec<IpAddr> = (1..=4).map(|i| IpAddr::from([203, 0, 113, i])).collect();
    let t0 = Instant::now();
    f.freeze(&ips[0], MIN, t0);
    assert_eq!(f.choose(&ips, t0), [ips[1], ips[2], ips[3]]);
    assert_eq!(f.choose(&ips, t0 + MIN), ips);
}

#[test]
fn bounded_under_many_failing_addresses() {
    let f = Freezer::new(64);
    let t0 = Instant::now();
    for i in 0..10_000u32 {
        f.freeze(&i, MIN, t0 + Duration::from_millis(u64::from(i)));
        assert!(f.len() <= 64);
    }
    assert!(f.is_frozen(&9_999, t0 + Duration::from_secs(10)));
}
