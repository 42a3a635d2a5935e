//! Two gateway replicas sharing limits and revocations through a real Redis
//! (`OSPREY_TEST_REDIS_URL`). Each test holds [`redis_limits_alone`]: the `osprey_ratelimit_*`
//! metrics its replicas move are the process's.

use std::collections::BTreeMap;

use osprey_services::config::TenantConfig;
use reqwest::Method;
use serde_json::Value;

use crate::common::*;

/// Two replicas sharing `redis`, serving a mock upstream to a new tenant with `limits`; returns
/// their base URLs and a key of the tenant.
async fn two_replicas(redis: String, limits: TenantConfig) -> ([String; 2], String) {
    let (store, store_url) = store().await;
    let t = unique("shared");
    let setup = Setup {
        store_url,
        redis: Some(redis),
        replicas: 2,
        tenants: BTreeMap::from([(t.clone(), limits)]),
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let replicas = [gateway(setup.clone()).await, gateway(setup).await];
    (replicas, new_key(&store, &t).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit() {
    let Some(redis) = redis_url("two_replicas_share_one_limit") else {
        return;
    };
    let _alone = redis_limits_alone().await;
    const LIMIT: u64 = 20;
    let (replicas, key) = two_replicas(redis, tenant(LIMIT, 1_000_000)).await;
    let start = std::time::Instant::now();
    let mut admitted = [0; 2];
    for i in 0..40 {
        let r = chat(&replicas[i % 2], Some(&key), hello("mock")).await;
        match r.status().as_u16() {
            200 => admitted[i % 2] += 1,
            429 => assert!(r.headers().contains_key("retry-after")),
            s => panic!("unexpected status {s}"),
        }
    }
    let total = admitted[0] + admitted[1];
    // The limit is 20 a minute with a minute's burst; one more refills every 3 s the test runs
    // (one in all, unless the tests running beside it slow it down).
    let refilled = (start.elapsed().as_secs_f64() * LIMIT as f64 / 60.0).ceil() as u64;
    assert!(
        (LIMIT..=LIMIT + refilled).contains(&total),
        "admitted {admitted:?}, refilled {refilled}"
    );
    assert!(
        admitted.iter().all(|&n| n >= 9),
        "both replicas served: {admitted:?}"
    );
}

/// A limit large enough to lease: most requests are admitted from leased units without a
/// Redis round trip, yet the replicas together admit no more than the limit, and strand at
/// most a sixteenth of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_limits_still_hold_across_replicas() {
    let Some(redis) = redis_url("leased_limits_still_hold_across_replicas") else {
        return;
    };
    let _alone = redis_limits_alone().await;
    const LIMIT: u64 = 1600;
    let (replicas, key) = two_replicas(redis, tenant(LIMIT, 1_000_000_000)).await;
    let calls = |base| async move {
        let check = r#"osprey_ratelimit_redis_calls_total{call="check"}"#;
        metric(base, check).await.unwrap_or(0.0)
    };
    let checks_before = calls(&replicas[0]).await;
    let leased_before = metric(&replicas[0], "osprey_ratelimit_leased_total")
        .await
        .unwrap_or(0.0);
    let start = std::time::Instant::now();
    let mut admitted = [0u64; 2];
    let requests = LIMIT as usize + 200;
    for wave in 0..requests / 16 {
        let sent = (0..16).map(|i| {
            let (base, key) = (&replicas[i % 2], &key);
            async move {
                (
                    i % 2,
                    chat(base, Some(key), hello("mock")).await.status().as_u16(),
                )
            }
        });
        for (replica, status) in futures_util::future::join_all(sent).await {
            match status {
                200 => admitted[replica] += 1,
                429 => {}
                s => panic!("wave {wave}: unexpected status {s}"),
            }
        }
    }
    let total = admitted[0] + admitted[1];
    // The bucket refills at LIMIT a minute while the test runs.
    let refilled = (start.elapsed().as_secs_f64() * LIMIT as f64 / 60.0).ceil() as u64 + 1;
    assert!(
        total <= LIMIT + refilled,
        "admitted {admitted:?}, refilled {refilled}"
    );
    assert!(
        total >= LIMIT - LIMIT / 16,
        "admitted {admitted:?}: too much stranded in leases"
    );
    assert!(
        admitted.iter().all(|&n| n >= LIMIT / 4),
        "both replicas served: {admitted:?}"
    );
    // Metrics are per process: both replicas count into the same ones.
    let checks = calls(&replicas[0]).await - checks_before;
    let leased = metric(&replicas[0], "osprey_ratelimit_leased_total")
        .await
        .unwrap()
        - leased_before;
    eprintln!("admitted {admitted:?} of {requests}, {leased} from leases, {checks} Redis checks");
    assert!(
        leased >= total as f64 / 2.0,
        "{leased} of {total} admitted from leases"
    );
    assert!(
        checks < requests as f64 / 4.0,
        "{checks} Redis checks on the request path for {requests} requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_every_replica_at_once() {
    let Some(redis) = redis_url("a_revocation_reaches_every_replica_at_once") else {
        return;
    };
    let _alone = redis_limits_alone().await;
    let (_, store_url) = store().await;
    let setup = Setup {
        store_url,
        redis: Some(redis),
        admin_key: Some("admin".into()),
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let (a, b) = (gateway(setup.clone()).await, gateway(setup).await);
    let body = serde_json::json!({"tenant": unique("rev")});
    let created: Value = admin(&a, "admin", Method::POST, "/admin/keys", Some(body))
        .await
        .json()
        .await
        .unwrap();
    let (secret, id) = (
        created["key"].as_str().unwrap(),
        created["id"].as_str().unwrap(),
    );
    // B learns of a key created on A from the shared store on its first use; the default
    // limits are large enough that B's later requests are admitted from leases, without
    // asking Redis.
    for _ in 0..20 {
        assert_eq!(chat(&b, Some(secret), hello("mock")).await.status(), 200);
    }
    let revoked = admin(
        &a,
        "admin",
        Method::DELETE,
        &format!("/admin/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(revoked.status(), 200);
    // B still has the key cached as active, and leased units: the revocation channel, which
    // B acknowledged before A answered, tells it otherwise on this very request.
    let r = chat(&b, Some(secret), hello("mock")).await;
    assert_eq!(r.status(), 401);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("revoked"));
    assert_eq!(chat(&a, Some(secret), hello("mock")).await.status(), 401);
}
