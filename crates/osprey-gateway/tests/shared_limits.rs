//! Two gateway replicas sharing limits and revocations through a real Redis
//! (`OSPREY_TEST_REDIS_URL`).

mod common;

use std::collections::BTreeMap;

use common::*;
use osprey_store::NewKey;
use reqwest::Method;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit() {
    let Some(redis) = redis_url("two_replicas_share_one_limit") else {
        return;
    };
    let (store, store_url) = store().await;
    let t = unique("shared");
    let setup = Setup {
        store_url,
        redis: Some(redis),
        replicas: 2,
        tenants: BTreeMap::from([(t.clone(), tenant(20, 1_000_000))]),
        upstreams: vec![("mock".into(), upstream().await)],
        ..Setup::default()
    };
    let replicas = [gateway(setup.clone()).await, gateway(setup).await];
    let key = store
        .create_key(NewKey::for_tenant(&t))
        .await
        .unwrap()
        .secret;
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
    // The limit is 20 a minute with a minute's burst; one more may refill during the test.
    assert!((20..=21).contains(&total), "admitted {admitted:?}");
    assert!(
        admitted.iter().all(|&n| n >= 9),
        "both replicas served: {admitted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_every_replica_at_once() {
    let Some(redis) = redis_url("a_revocation_reaches_every_replica_at_once") else {
        return;
    };
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
    // B learns of a key created on A from the shared store on its first use.
    assert_eq!(chat(&b, Some(secret), hello("mock")).await.status(), 200);
    let revoked = admin(
        &a,
        "admin",
        Method::DELETE,
        &format!("/admin/keys/{id}"),
        None,
    )
    .await;
    assert_eq!(revoked.status(), 200);
    // B still has the key cached as active: Redis tells it otherwise on this very request.
    let r = chat(&b, Some(secret), hello("mock")).await;
    assert_eq!(r.status(), 401);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("revoked"));
    assert_eq!(chat(&a, Some(secret), hello("mock")).await.status(), 401);
}
