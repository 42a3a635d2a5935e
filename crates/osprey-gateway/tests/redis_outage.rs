//! Redis going away mid-test, through a proxy in front of the real Redis
//! (`OSPREY_TEST_REDIS_URL`): requests keep passing on local limits (this replica's share), the
//! switch shows in /metrics, and limits are shared again once Redis is back. The metrics it
//! reads are the process's: it holds [`redis_limits_alone`], so no other gateway limiting
//! through Redis moves them meanwhile.

use std::collections::BTreeMap;
use std::time::Duration;

use osprey_testkit::eventually;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_redis_falls_back_to_local_shares_and_recovers() {
    let Some(redis) = redis_url("losing_redis_falls_back_to_local_shares_and_recovers") else {
        return;
    };
    let _alone = redis_limits_alone().await;
    let proxy = Proxy::start(&redis).await;
    let (store, store_url) = store().await;
    let t = unique("outage");
    let setup = Setup {
        store_url,
        redis: Some(proxy.url.clone()),
        replicas: 2,
        tenants: BTreeMap::from([(t.clone(), tenant(1000, 10_000_000))]),
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let base = gateway(setup).await;
    let key = new_key(&store, &t).await;
    let limit_seen = |r: &reqwest::Response| header_num(r, "x-ratelimit-limit-requests");

    for _ in 0..5 {
        let r = chat(&base, Some(&key), hello("mock")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(limit_seen(&r), 1000, "the shared limit");
    }
    proxy.down();
    // Units already leased from Redis are spent first (Redis charged them); then the replica
    // finds Redis gone and enforces its share.
    let mut limits = Vec::new();
    for i in 0..60 {
        let r = chat(&base, Some(&key), hello("mock")).await;
        assert_eq!(r.status(), 200, "request {i} during the outage");
        limits.push(limit_seen(&r));
    }
    let local = limits.iter().position(|&l| l == 500);
    let local = local.unwrap_or_else(|| panic!("never fell back to the local share: {limits:?}"));
    assert!(
        limits[local..].iter().all(|&l| l == 500),
        "this replica's share of the limit from then on: {limits:?}"
    );
    assert_eq!(metric(&base, "osprey_ratelimit_redis_up").await, Some(0.0));
    proxy.up();
    // Redis is retried a second after the last failure: limits are shared again once it is back.
    eventually(
        || async {
            let r = chat(&base, Some(&key), hello("mock")).await;
            assert_eq!(r.status(), 200);
            (limit_seen(&r) == 1000).then_some(())
        },
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(metric(&base, "osprey_ratelimit_redis_up").await, Some(1.0));
}
