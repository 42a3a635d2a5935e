//! Ingest jobs: documents posted to a collection are chunked, embedded and indexed by one
//! background thread, one job at a time, so ingestion never holds a serving thread. A job's
//! status can be polled until it has `succeeded` or `failed`.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use crate::{Collection, Document, IngestOptions, IngestReport};
use serde::Serialize;

/// Finished jobs remembered, oldest forgotten first.
const KEPT: usize = 1000;

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for the jobs before it.
    Queued,
    /// Being indexed.
    Running,
    /// Done.
    Succeeded,
    /// Stopped by an error.
    Failed,
}

/// A job as its status route shows it.
#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    /// `ingest_…`.
    pub id: String,
    /// Always `collection.ingest_job`.
    pub object: &'static str,
    /// The collection written.
    pub collection: String,
    /// Where it is.
    pub status: Status,
    /// Documents posted.
    pub documents: usize,
    /// Chunks written so far.
    pub chunks_done: usize,
    /// When it was posted, Unix seconds.
    pub created_at: i64,
    /// When it finished, Unix seconds.
    pub finished_at: Option<i64>,
    /// What it did, once succeeded.
    pub report: Option<IngestReport>,
    /// Why it failed.
    pub error: Option<String>,
    #[serde(skip)]
    tenant: String,
}

struct Job {
    id: String,
    collection: Arc<Collection>,
    documents: Vec<Document>,
    options: IngestOptions,
    embedder: Arc<osprey_engine::Embedder>,
}

/// The jobs of this server.
#[derive(Default)]
pub struct IngestJobs {
    views: Arc<Views>,
    queue: OnceLock<Mutex<Sender<Job>>>,
}

impl IngestJobs {
    /// Queues `documents` for `collection` (named `name`, of `tenant`) and returns the job.
    pub fn submit(
        &self,
        tenant: &str,
        name: &str,
        collection: Arc<Collection>,
        documents: Vec<Document>,
        options: IngestOptions,
        embedder: Arc<osprey_engine::Embedder>,
    ) -> JobView {
        let id = format!("ingest_{:016x}", rand::random::<u64>());
        let view = JobView {
            id: id.clone(),
            object: "collection.ingest_job",
            collection: name.to_owned(),
            status: Status::Queued,
            documents: documents.len(),
            chunks_done: 0,
            created_at: crate::now_ms() / 1000,
            finished_at: None,
            report: None,
            error: None,
            tenant: tenant.to_owned(),
        };
        {
            let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
            views.0.insert(id.clone(), view.clone());
            views.1.push_back(id.clone());
            while views.1.len() > KEPT {
                let Some(old) = views.1.pop_front() else {
                    break;
                };
                views.0.remove(&old);
            }
        }
        let job = Job {
            id,
            collection,
            documents,
            options,
            embedder,
        };
        let queue = self.queue.get_or_init(|| Mutex::new(self.start()));
        let sent = queue.lock().unwrap_or_else(|e| e.into_inner()).send(job);
        if let Err(unsent) = sent {
            self.update(&unsent.0.id, |v| {
                v.status = Status::Failed;
                v.error = Some("the ingest worker has stopped".into());
            });
        }
        view
    }

    /// Job `id`, if tenant `tenant` posted it.
    pub fn get(&self, tenant: &str, id: &str) -> Option<JobView> {
        let views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        views.0.get(id).filter(|v| v.tenant == tenant).cloned()
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut JobView)) {
        update(&self.views, id, change);
    }

    /// The worker thread: one job at a time, in order.
    fn start(&self) -> Sender<Job> {
        let (tx, rx) = channel::<Job>();
        let views = self.views.clone();
        std::thread::Builder::new()
            .name("osprey-ingest".into())
            .spawn(move || {
                for job in rx {
                    update(&views, &job.id, |v| v.status = Status::Running);
                    let mut done = 0;
                    let result = job.collection.ingest(
                        &job.documents,
                        &job.options,
                        job.embedder.as_ref(),
                        &mut |chunks| {
                            done += chunks;
                            update(&views, &job.id, |v| v.chunks_done = done);
                        },
                    );
                    metrics::counter!(osprey_core::metrics::RAG_CHUNKS_INGESTED)
                        .increment(done as u64);
                    update(&views, &job.id, |v| {
                        v.finished_at = Some(crate::now_ms() / 1000);
                        match result {
                            Ok(report) => (v.status, v.report) = (Status::Succeeded, Some(report)),
                            Err(e) => (v.status, v.error) = (Status::Failed, Some(e.to_string())),
                        }
                    });
                }
            })
            .expect("spawning the ingest thread");
        tx
    }
}

/// The jobs by id, and their ids oldest first (to forget the oldest).
type Views = Mutex<(HashMap<String, JobView>, VecDeque<String>)>;

fn update(views: &Views, id: &str, change: impl FnOnce(&mut JobView)) {
    let mut views = views.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = views.0.get_mut(id) {
        change(v);
    }
}
