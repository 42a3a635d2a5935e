//! A full disk under the SQLite store: while it is full, writes are refused as "unavailable"
//! (the gateway's 503 `store_unavailable`); once space returns, writes work again on the same
//! handle; and every write the store acknowledged is there, on that handle and after a reopen.
//!
//! The disk fills through a file-size limit (`RLIMIT_FSIZE`, with `SIGXFSZ` ignored, so a write
//! past it fails as a full disk's would), which is per process: the test runs its body in a
//! child process of its own, so no mount, no root and no other test is touched.

use std::collections::BTreeMap;
use std::path::Path;

use osprey_store::{NewItem, Owner, Store, StoreError};

/// Set only in the child process that runs [`writes_through_a_full_disk`].
const CHILD_VAR: &str = "OSPREY_DISK_FULL_CHILD";
/// Concurrent writers, as many as the pool's connections, so a spoiled connection is reused.
const WRITERS: usize = 4;

#[test]
fn a_full_disk_loses_no_acknowledged_write() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "writes_through_a_full_disk",
            "--nocapture",
        ])
        .env(CHILD_VAR, "1")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("1 passed"), "{said}");
}

/// What one writer was told had been stored, conversation by conversation.
#[derive(Default)]
struct Acknowledged {
    /// Conversation id → (its acknowledged item ids, the last acknowledged metadata `n`).
    conversations: BTreeMap<String, (Vec<String>, i64)>,
    writes: usize,
    refused: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_full_disk_loses_no_acknowledged_write"]
async fn writes_through_a_full_disk() {
    assert!(
        std::env::var_os(CHILD_VAR).is_some(),
        "run by a_full_disk_loses_no_acknowledged_write, which sets its file-size limit"
    );
    let test = osprey_store::testing::sqlite().await;
    let dir = test.dir.clone().unwrap();
    let owner = Owner {
        tenant: "acme".into(),
        user: "ada".into(),
    };

    // The disk fills: no file of the store may grow more than 256 KiB past its size now.
    let limit = largest_file(&dir) + 256 * 1024;
    let full = FileSizeLimit::set(limit);
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (store, owner) = (test.store.clone(), owner.clone());
        writers.push(tokio::spawn(async move {
            let mut acked = Acknowledged::default();
            // Until this writer has been refused a good many times, so refusals meet every
            // kind of write, on every connection.
            while acked.refused < 40 {
                write_once(&store, &owner, w, &mut acked, Phase::Full).await;
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for writer in writers {
        acked.push(writer.await.unwrap());
    }
    drop(full);

    // Space returns: every write succeeds again, on the same store handle.
    for (w, acked) in acked.iter_mut().enumerate() {
        for _ in 0..10 {
            write_once(&test.store, &owner, w, acked, Phase::SpaceAgain).await;
        }
    }
    let writes: usize = acked.iter().map(|a| a.writes).sum();
    let refused: usize = acked.iter().map(|a| a.refused).sum();
    println!("{writes} writes acknowledged, {refused} refused while the disk was full");
    assert!(refused > 0 && writes > 0);

    // Every acknowledged write is there, on this handle and on a fresh one.
    check_all_there(&test.store, &owner, &acked).await;
    test.store.close().await;
    let reopened = Store::open(&Store::default_url(&dir)).await.unwrap();
    check_all_there(&reopened, &owner, &acked).await;
}

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Full,
    SpaceAgain,
}

/// One write of writer `w`: a new conversation with items (a transaction), or more items for
/// one of its conversations (a transaction), or new metadata for one (a single statement).
async fn write_once(
    store: &Store,
    owner: &Owner,
    w: usize,
    acked: &mut Acknowledged,
    phase: Phase,
) {
    let turn = acked.writes + acked.refused;
    let text = format!("writer {w} turn {turn} ").repeat(200);
    let items = [
        NewItem::new("user", &text),
        NewItem::new("assistant", &text),
    ];
    let existing = acked
        .conversations
        .keys()
        .nth(turn % acked.conversations.len().max(1));
    let result = match (turn % 3, existing.cloned()) {
        (1, Some(id)) => store.append_items(owner, &id, &items).await.map(|added| {
            let entry = acked.conversations.get_mut(&id).unwrap();
            entry.0.extend(added.into_iter().map(|item| item.id));
        }),
        (2, Some(id)) => {
            let n = turn as i64;
            store
                .update_conversation(owner, &id, &format!(r#"{{"n":{n}}}"#))
                .await
                .map(|_| acked.conversations.get_mut(&id).unwrap().1 = n)
        }
        _ => store
            .create_conversation(owner, r#"{"n":-1}"#, &items)
            .await
            .map(|(record, added)| {
                let ids = added.into_iter().map(|item| item.id).collect();
                acked.conversations.insert(record.id, (ids, -1));
            }),
    };
    match result {
        Ok(()) => acked.writes += 1,
        Err(e) => {
            assert!(
                phase == Phase::Full,
                "a write failed after space returned: {e}"
            );
            assert!(
                !matches!(e, StoreError::NotFound(_)),
                "an acknowledged write is gone: {e}"
            );
            assert!(
                e.is_unavailable(),
                "a full disk is `unavailable`, not {e:?}"
            );
            acked.refused += 1;
        }
    }
}

async fn check_all_there(store: &Store, owner: &Owner, acked: &[Acknowledged]) {
    for (id, (items, n)) in acked.iter().flat_map(|a| &a.conversations) {
        let conversation = store
            .conversation(owner, id)
            .await
            .unwrap_or_else(|e| panic!("acknowledged conversation {id}: {e}"));
        let meta: serde_json::Value = serde_json::from_str(&conversation.metadata).unwrap();
        // A refused update may still have landed (its outcome was unknown), never an older one.
        assert!(
            meta["n"].as_i64().unwrap() >= *n,
            "{id}: metadata {meta} older than n={n}"
        );
        for item in items {
            store
                .item(owner, id, item)
                .await
                .unwrap_or_else(|e| panic!("acknowledged item {item} of {id}: {e}"));
        }
    }
}

fn largest_file(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().len())
        .max()
        .unwrap_or(0)
}

/// A lowered soft `RLIMIT_FSIZE` for this process, raised back on drop.
struct FileSizeLimit(libc::rlimit);

impl FileSizeLimit {
    fn set(bytes: u64) -> Self {
        let mut before = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain system calls on a valid, owned struct; ignoring SIGXFSZ turns a write
        // past the limit into the EFBIG error a full disk's ENOSPC would be.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut before), 0);
            let lowered = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: before.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lowered), 0);
        }
        Self(before)
    }
}

impl Drop for FileSizeLimit {
    fn drop(&mut self) {
        // SAFETY: restores the limit read in `set`.
        unsafe {
            libc::setrlimit(libc::RLIMIT_FSIZE, &self.0);
        }
    }
}
