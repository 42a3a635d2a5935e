//! Durability under load: a real `osprey serve` process takes writes from concurrent clients
//! (conversations and their items, memory facts, prompt versions) and
//! - is killed with SIGKILL mid-stream; after a restart on the same store, every write it
//!   acknowledged is there. On SQLite, and on Postgres when `OSPREY_TEST_POSTGRES_URL` is set;
//! - loses its Postgres mid-stream (a private cluster of the test's own, stopped in `immediate`
//!   mode, as a crash would, then started again): writes fail with 503 while it is down,
//!   succeed again once it is back without restarting Osprey, and every write acknowledged
//!   before, during or after is there.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use osprey_testkit::eventually;
use serde_json::{Value, json};

use crate::support;

/// The admin key of the servers under test.
const ADMIN: &str = "durability-admin";

/// `osprey serve --no-engine` on `store`; killed (SIGKILL) when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    async fn start(store: &str) -> Self {
        let port = osprey_testkit::free_port().to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_osprey"))
            .args(["serve", "--no-engine", "--port", &port, "--store", store])
            .args(["--admin-key", ADMIN])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("starting osprey");
        // Killed and waited for on drop, also if it never comes up.
        let server = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        support::up(&client(), &server.base, "/health").await;
        server
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL"); // Child::kill is SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The JSON at `url`, read as the writers' user.
async fn read(url: String) -> Value {
    (client().get(url).header("x-osprey-user", "w"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Every text in conversation `id`, oldest first, read page by page.
async fn texts(base: &str, id: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let url = format!("{base}/v1/conversations/{id}/items?order=asc&limit=100{after}");
        let page = read(url).await;
        let data = page["data"].as_array().expect("a page of items");
        out.extend(
            data.iter()
                .map(|i| i["content"][0]["text"].as_str().unwrap().to_owned()),
        );
        match (page["has_more"].as_bool(), page["last_id"].as_str()) {
            (Some(true), Some(last)) => after = format!("&after={last}"),
            _ => return out,
        }
    }
}

/// What writers had acknowledged: the texts appended, the conversations created, the facts
/// kept and the prompts pushed.
#[derive(Default)]
struct Acknowledged {
    appended: BTreeSet<String>,
    created: BTreeSet<String>,
    facts: BTreeSet<String>,
    prompts: BTreeSet<String>,
    /// Writes refused (not acknowledged), by status.
    refused: Vec<u16>,
}

/// What the writers have acknowledged so far, as they go.
type Progress = Arc<Mutex<Acknowledged>>;

impl Acknowledged {
    /// How many writes were acknowledged, of every kind.
    fn writes(&self) -> usize {
        self.appended.len() + self.created.len() + self.facts.len() + self.prompts.len()
    }
}

/// Waits until the writers have had more than `n` appends acknowledged.
async fn appended_more_than(progress: &Progress, n: usize) {
    eventually(
        || async move { (progress.lock().unwrap().appended.len() > n).then_some(()) },
        Duration::from_secs(60),
    )
    .await;
}

/// Six writers append to conversation `id` and create new ones while `during` runs (given
/// their progress), then stop; a writer also stops when the server is gone. Returns what was
/// acknowledged.
async fn write_while<F, Fut>(base: &str, id: &str, during: F) -> Acknowledged
where
    F: FnOnce(Progress) -> Fut,
    Fut: Future<Output = ()>,
{
    let acked: Progress = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..6 {
        let (base, id) = (base.to_owned(), id.to_owned());
        let (acked, stop) = (acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            for n in 0.. {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let text = format!("w{w}-{n}");
                let items = json!({"items": [{"role": "user", "content": text}]});
                let prompt = json!({"messages": [{"role": "system", "content": text}]});
                let (r, body) = match n % 6 {
                    0 => (client().post(format!("{base}/v1/conversations")), items),
                    4 => (
                        client().post(format!("{base}/v1/memory/facts")),
                        json!({"content": text}),
                    ),
                    5 => (
                        client()
                            .post(format!("{base}/admin/prompts/p-{text}"))
                            .bearer_auth(ADMIN),
                        prompt,
                    ),
                    _ => (
                        client().post(format!("{base}/v1/conversations/{id}/items")),
                        items,
                    ),
                };
                let Ok(r) = r.header("x-osprey-user", "w").json(&body).send().await else {
                    return; // the server is gone
                };
                if !r.status().is_success() {
                    acked.lock().unwrap().refused.push(r.status().as_u16());
                    // Pacing, not a wait for something: a refused writer retries a little later.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let Ok(v) = r.json::<Value>().await else {
                    return;
                };
                let mut acked = acked.lock().unwrap();
                match n % 6 {
                    0 => acked.created.insert(v["id"].as_str().unwrap().to_owned()),
                    4 => acked.facts.insert(text),
                    5 => acked.prompts.insert(format!("p-{text}")),
                    _ => acked.appended.insert(text),
                };
            }
        }));
    }
    during(acked.clone()).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }
    std::mem::take(&mut *acked.lock().unwrap())
}

/// Checks that every write in `acked` is kept by the server at `base`.
async fn all_kept(base: &str, id: &str, acked: &Acknowledged) -> usize {
    let kept: BTreeSet<String> = texts(base, id).await.into_iter().collect();
    let lost: Vec<&String> = acked.appended.difference(&kept).collect();
    assert!(lost.is_empty(), "acknowledged appends lost: {lost:?}");
    for conv in &acked.created {
        let r = (client().get(format!("{base}/v1/conversations/{conv}")))
            .header("x-osprey-user", "w")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "acknowledged conversation {conv} lost");
    }
    let facts = read(format!("{base}/v1/memory/facts")).await;
    let facts: BTreeSet<String> = (facts["data"].as_array().unwrap().iter())
        .map(|f| f["content"].as_str().unwrap().to_owned())
        .collect();
    let lost: Vec<&String> = acked.facts.difference(&facts).collect();
    assert!(lost.is_empty(), "acknowledged facts lost: {lost:?}");
    for name in &acked.prompts {
        let r = (client().get(format!("{base}/admin/prompts/{name}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "acknowledged prompt {name} lost");
    }
    kept.len()
}

/// A new conversation of the writers' user; its id.
async fn conversation(base: &str) -> String {
    let c: Value = (client().post(format!("{base}/v1/conversations")))
        .header("x-osprey-user", "w")
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    c["id"].as_str().unwrap().to_owned()
}

async fn every_acknowledged_write_survives(store: &str) {
    let mut server = Server::start(store).await;
    let id = conversation(&server.base).await;
    let base = server.base.clone();
    let acked = write_while(&base, &id, |progress| async move {
        // Killed mid-stream, once the writers have got going.
        appended_more_than(&progress, 20).await;
        server.kill();
    })
    .await;
    assert!(
        acked.appended.len() > 20,
        "the writers got going: {}",
        acked.appended.len()
    );
    let server = Server::start(store).await;
    let kept = all_kept(&server.base, &id, &acked).await;
    eprintln!(
        "{store}: {} appends, {} conversations, {} facts and {} prompt versions acknowledged \
         before SIGKILL, all there after restart ({kept} items kept: writes in flight at the \
         kill may land without an answer)",
        acked.appended.len(),
        acked.created.len(),
        acked.facts.len(),
        acked.prompts.len(),
    );
}

#[tokio::test]
async fn acknowledged_writes_survive_sigkill_on_sqlite() {
    let path = std::env::temp_dir().join(format!("osprey-durability-{}.db", std::process::id()));
    every_acknowledged_write_survives(&format!("sqlite://{}", path.display())).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[tokio::test]
async fn acknowledged_writes_survive_sigkill_on_postgres() {
    match osprey_store::testing::postgres_url().await {
        Some(url) => every_acknowledged_write_survives(&url).await,
        None => eprintln!("SKIPPED: OSPREY_TEST_POSTGRES_URL is not set (.ci/run sets it)"),
    }
}

#[tokio::test]
async fn acknowledged_writes_survive_a_postgres_crash_and_restart_mid_load() {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let server = Server::start(&pg.url()).await;
    let id = conversation(&server.base).await;
    let pg = &pg; // borrowed: the cluster lives on after the writers stop
    let acked = write_while(&server.base, &id, |progress| async move {
        // Crashed once the writers have got going.
        appended_more_than(&progress, 20).await;
        pg.ctl_async(&["stop", "-m", "immediate"]).await;
        // Down until a write has waited out its wait for a connection (3 s) and was refused.
        let progress = &progress;
        eventually(
            || async move {
                progress
                    .lock()
                    .unwrap()
                    .refused
                    .contains(&503)
                    .then_some(())
            },
            Duration::from_secs(60),
        )
        .await;
        pg.ctl_async(&["start", "-w", "-l", &pg.log()]).await;
        // Back: writes are acknowledged again, without restarting Osprey.
        let before = progress.lock().unwrap().writes();
        eventually(
            || async move { (progress.lock().unwrap().writes() > before + 20).then_some(()) },
            Duration::from_secs(60),
        )
        .await;
    })
    .await;
    let unavailable = acked.refused.iter().filter(|&&s| s == 503).count();
    assert!(
        unavailable > 0,
        "writes were refused while Postgres was down: {:?}",
        acked.refused
    );
    assert_eq!(
        unavailable,
        acked.refused.len(),
        "every refusal is a 503: {:?}",
        acked.refused
    );
    let kept = all_kept(&server.base, &id, &acked).await;
    let after = conversation(&server.base).await;
    assert!(
        after.starts_with("conv_"),
        "the server recovered without a restart"
    );
    eprintln!(
        "Postgres crashed and restarted mid-load: {} appends, {} conversations, {} facts and {} \
         prompt versions acknowledged, all there ({kept} items kept); {unavailable} writes \
         refused with 503 while it was down",
        acked.appended.len(),
        acked.created.len(),
        acked.facts.len(),
        acked.prompts.len(),
    );
}

/// A Postgres cluster of the test's own in a temporary directory, on a free port, run by the
/// `postgres` system user (Postgres refuses root); stopped and removed on drop. `None`, saying
/// why, where this machine has no Postgres binaries or no `postgres` user.
struct PrivatePostgres(Cluster);

/// Where a private cluster lives and listens.
#[derive(Clone)]
struct Cluster {
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
    port: u16,
}

impl std::ops::Deref for PrivatePostgres {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl PrivatePostgres {
    fn start() -> Option<Self> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .find(|b| b.join("pg_ctl").exists());
        let Some(bin) = bin else {
            eprintln!("SKIPPED: no Postgres server binaries under /usr/lib/postgresql");
            return None;
        };
        let dir = std::env::temp_dir().join(format!("osprey-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let owned = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status();
        if !owned.is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED: the test cannot hand a directory to the postgres user");
            return None;
        }
        let pg = Cluster {
            bin,
            dir,
            port: osprey_testkit::free_port(),
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
        );
        pg.ctl(&["start", "-w", "-l", &pg.log()]);
        Some(Self(pg))
    }
}

impl Cluster {
    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn log(&self) -> String {
        self.dir.join("log").display().to_string()
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl ARGS` on the cluster, listening on its port only.
    fn ctl(&self, args: &[&str]) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.display()
        );
        let data = self.data();
        let mut all = vec!["-D", &data, "-o", &options];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all);
    }

    /// [`Self::ctl`] off the runtime's threads, so the writers go on meanwhile.
    async fn ctl_async(&self, args: &[&str]) {
        let pg = self.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            pg.ctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
        })
        .await
        .unwrap();
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let status = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(tool))
            .args(args)
            .stdout(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("running {tool}: {e}"));
        assert!(status.success(), "{tool} {args:?} failed");
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data(), "stop", "-m", "immediate"])
            .stdout(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
