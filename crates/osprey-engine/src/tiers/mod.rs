//! KV cache tiers below the hot pool: blocks evicted from the engine's pool move down, and come
//! back up when a new request's prefix is found below.
//!
//! ```text
//!   hot pool (f16, the engine's)  ──evict──▶  warm: host RAM, encoded    ──evict──▶  cold: disk
//!        ▲                                     (int8 or f16, byte cap)               (segments, cap)
//!        └──────── fetch: warm, then cold, then shared ◀───────────────  shared: Redis (TTL, cap)
//! ```
//!
//! One thread ([`KvTiers`]) owns the lower tiers and does all their work — encoding, disk and
//! network I/O — so the engine's step loop never waits on it: the loop hands it evicted blocks
//! ([`KvTiers::store`]) and asks for a waiting request's missing prefix blocks
//! ([`KvTiers::fetch`]); the answer arrives while other sequences keep stepping, and the loop
//! collects it ([`KvTiers::poll`]) and puts the blocks back in the hot pool's prefix cache.
//! A block is keyed by its chained hash (which starts from the tenant's salt) and carries its
//! 16 tokens, checked on the way up; the shared tier's keys also name the model.

mod codec;
mod cold;
mod shared;
mod warm;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use osprey_core::metrics as names;
use osprey_models::BLOCK_SIZE;
use sha2::{Digest, Sha256};

pub use codec::Codec;
pub use cold::ColdStore;
pub use shared::{SharedConfig, SharedStore};
pub use warm::WarmStore;

use crate::kv::BlockHash;

/// Which lower tiers run, and how big they are.
#[derive(Clone, Debug, Default)]
pub struct TierConfig {
    /// Bytes of host RAM for the warm tier (0: no warm tier).
    pub warm_bytes: usize,
    /// The cold tier's directory and byte cap (none: no cold tier).
    pub cold: Option<(PathBuf, u64)>,
    /// The shared tier (none: no shared tier).
    pub shared: Option<SharedConfig>,
    /// How blocks are stored below the hot pool.
    pub codec: Codec,
}

impl TierConfig {
    /// Whether any lower tier runs.
    pub fn enabled(&self) -> bool {
        self.warm_bytes > 0 || self.cold.is_some() || self.shared.is_some()
    }
}

/// A tier below the hot pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Host RAM.
    Warm = 0,
    /// Local disk.
    Cold = 1,
    /// Redis.
    Shared = 2,
}

impl Tier {
    /// The tier's name in metrics and headers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Warm => "warm",
            Self::Cold => "cold",
            Self::Shared => "redis",
        }
    }
}

/// A block as stored below the hot pool: its identity, its tokens and its encoded contents.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredBlock {
    /// Chained hash of the block and everything before it.
    pub hash: BlockHash,
    /// Its tokens, checked against the asking sequence's on the way up.
    pub tokens: [u32; BLOCK_SIZE],
    /// How `bytes` are encoded.
    pub codec: Codec,
    /// The encoded contents.
    pub bytes: Vec<u8>,
    /// The attention its content drew in the hot pool (eviction weighs it).
    pub heat: f32,
}

/// `OSKV`, then a format version.
const MAGIC: [u8; 5] = *b"OSKV1";
/// Magic, codec, hash, tokens, heat, payload length.
const HEADER: usize = 5 + 1 + 16 + 4 * BLOCK_SIZE + 4 + 4;
/// The checksum after the payload: the first 16 bytes of SHA-256 of everything before.
const CHECKSUM: usize = 16;

impl StoredBlock {
    /// Bytes it takes in memory.
    pub fn size(&self) -> usize {
        self.bytes.len() + HEADER
    }

    /// The block as a self-checking record (for the cold and shared tiers).
    pub fn to_record(&self) -> Vec<u8> {
        let mut r = Vec::with_capacity(HEADER + self.bytes.len() + CHECKSUM);
        r.extend_from_slice(&MAGIC);
        r.push(match self.codec {
            Codec::F16 => 0,
            Codec::Int8 => 1,
        });
        r.extend_from_slice(&self.hash.to_le_bytes());
        self.tokens
            .iter()
            .for_each(|t| r.extend_from_slice(&t.to_le_bytes()));
        r.extend_from_slice(&self.heat.to_le_bytes());
        r.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        r.extend_from_slice(&self.bytes);
        let sum = Sha256::digest(&r);
        r.extend_from_slice(&sum[..CHECKSUM]);
        r
    }

    /// Reads the record at the start of `data`: the block and the record's length, or `None`
    /// if it is short, of another format or fails its checksum.
    pub fn from_record(data: &[u8]) -> Option<(Self, usize)> {
        if data.len() < HEADER + CHECKSUM || data[..5] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(data[i..i + 4].try_into().expect("4 bytes"));
        let payload = u32_at(HEADER - 4) as usize;
        let end = HEADER + payload;
        if data.len() < end + CHECKSUM
            || Sha256::digest(&data[..end])[..CHECKSUM] != data[end..end + CHECKSUM]
        {
            return None;
        }
        let codec = match data[5] {
            0 => Codec::F16,
            1 => Codec::Int8,
            _ => return None,
        };
        let mut tokens = [0u32; BLOCK_SIZE];
        for (i, t) in tokens.iter_mut().enumerate() {
            *t = u32_at(22 + 4 * i);
        }
        let block = Self {
            hash: u128::from_le_bytes(data[6..22].try_into().expect("16 bytes")),
            tokens,
            codec,
            heat: f32::from_le_bytes(data[HEADER - 8..HEADER - 4].try_into().expect("4 bytes")),
            bytes: data[HEADER..end].to_vec(),
        };
        Some((block, end + CHECKSUM))
    }
}

/// A block fetched back up, decoded, ready for the hot pool.
pub struct FetchedBlock {
    /// Its hash.
    pub hash: BlockHash,
    /// Its tokens (those the fetch asked for).
    pub tokens: [u32; BLOCK_SIZE],
    /// Its contents in the pool's layout (`KvCache::read_block`).
    pub data: Vec<u16>,
    /// Where it was found.
    pub tier: Tier,
}

/// The answer to one [`KvTiers::fetch`]: the leading run of the asked blocks that some tier
/// held, in order (possibly none).
pub struct Fetched {
    /// The ticket [`KvTiers::fetch`] returned.
    pub ticket: u64,
    /// The blocks found.
    pub blocks: Vec<FetchedBlock>,
}

enum Job {
    Store(StoredBlock, Vec<u16>),
    Fetch(u64, Vec<(BlockHash, [u32; BLOCK_SIZE])>),
}

/// The engine loop's handle on the tier thread.
pub struct KvTiers {
    jobs: mpsc::Sender<Job>,
    done: mpsc::Receiver<Fetched>,
    next_ticket: u64,
    pending: usize,
    label: metrics::SharedString,
}

/// How a block's contents are laid out: values per block and per encoding group.
#[derive(Clone, Copy, Debug)]
pub struct BlockLayout {
    /// `f16` values in a block.
    pub len: usize,
    /// Values per (layer, side, head) group: one scale each under `int8`.
    pub group: usize,
}

impl KvTiers {
    /// Starts the tier thread for a model fingerprinted `model` whose blocks are laid out as
    /// `layout`. Opening the cold tier's directory is the only thing that can fail here;
    /// Redis is contacted on first use.
    /// `label` is the `model` label of its metrics.
    pub fn start(
        config: TierConfig,
        model: &str,
        layout: BlockLayout,
        label: metrics::SharedString,
    ) -> std::io::Result<Self> {
        let cold = match &config.cold {
            Some((dir, cap)) => Some(ColdStore::open(&dir.join(model), *cap)?),
            None => None,
        };
        let shared = match &config.shared {
            Some(s) => {
                let block_bytes = config.codec.encoded_len(layout.len, layout.group);
                let store = SharedStore::new(s.clone(), model, block_bytes);
                Some(store.map_err(std::io::Error::other)?)
            }
            None => None,
        };
        let (jobs, rx) = mpsc::channel();
        let (tx, done) = mpsc::channel();
        let worker_label = label.clone();
        let worker = TierWorker {
            warm: WarmStore::new(config.warm_bytes),
            cold,
            shared,
            codec: config.codec,
            layout,
            label,
        };
        std::thread::Builder::new()
            .name("osprey-kv-tiers".into())
            .spawn(move || worker.run(rx, tx))?;
        Ok(Self {
            jobs,
            done,
            next_ticket: 0,
            pending: 0,
            label: worker_label,
        })
    }

    /// The `model` label of the tiers' metrics.
    pub fn label(&self) -> &metrics::SharedString {
        &self.label
    }

    /// Hands an evicted block (its contents, as read from the pool) down the tiers.
    pub fn store(&self, hash: BlockHash, tokens: [u32; BLOCK_SIZE], data: Vec<u16>, heat: f32) {
        let block = StoredBlock {
            hash,
            tokens,
            codec: Codec::F16,
            bytes: Vec::new(),
            heat,
        };
        let _ = self.jobs.send(Job::Store(block, data));
    }

    /// Asks for `wanted` blocks (in chain order, with their tokens); the answer comes back
    /// through [`Self::poll`] under the returned ticket.
    pub fn fetch(&mut self, wanted: Vec<(BlockHash, [u32; BLOCK_SIZE])>) -> u64 {
        self.next_ticket += 1;
        self.pending += 1;
        let _ = self.jobs.send(Job::Fetch(self.next_ticket, wanted));
        self.next_ticket
    }

    /// Fetches asked for and not yet collected.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Answers that have arrived; waits up to `wait` for the first when none has.
    pub fn poll(&mut self, wait: Duration) -> Vec<Fetched> {
        let mut out: Vec<Fetched> = self.done.try_iter().collect();
        if out.is_empty() && self.pending > 0 && !wait.is_zero() {
            out.extend(self.done.recv_timeout(wait).ok());
        }
        self.pending -= out.len().min(self.pending);
        out
    }
}

/// The tier thread's state.
struct TierWorker {
    warm: WarmStore,
    cold: Option<ColdStore>,
    shared: Option<SharedStore>,
    codec: Codec,
    layout: BlockLayout,
    /// The `model` label of its metrics.
    label: metrics::SharedString,
}

impl TierWorker {
    fn run(mut self, jobs: mpsc::Receiver<Job>, done: mpsc::Sender<Fetched>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "the KV tier thread could not start its runtime");
                return;
            }
        };
        while let Ok(job) = jobs.recv() {
            match job {
                Job::Store(mut block, data) => {
                    block.codec = self.codec;
                    block.bytes = self.codec.encode(&data, self.layout.group);
                    runtime.block_on(self.store(block));
                }
                Job::Fetch(ticket, wanted) => {
                    let blocks = runtime.block_on(self.fetch(&wanted));
                    if done.send(Fetched { ticket, blocks }).is_err() {
                        return;
                    }
                }
            }
            self.publish();
        }
    }

    /// Puts a block into the warm tier (or straight into the cold one when there is no warm
    /// tier) and into the shared tier; what the warm tier evicts goes cold.
    async fn store(&mut self, block: StoredBlock) {
        if let Some(shared) = &mut self.shared {
            shared.put(&block).await;
            metrics::counter!(names::KV_TIER_STORED, "model" => self.label.clone(), "tier" => Tier::Shared.as_str()).increment(1);
        }
        let down = if self.warm.cap() > 0 {
            metrics::counter!(names::KV_TIER_STORED, "model" => self.label.clone(), "tier" => Tier::Warm.as_str()).increment(1);
            self.warm.insert(block)
        } else {
            vec![block]
        };
        if let Some(cold) = &mut self.cold {
            for b in down {
                match cold.put(&b) {
                    Ok(()) => {
                        metrics::counter!(names::KV_TIER_STORED, "model" => self.label.clone(), "tier" => Tier::Cold.as_str())
                            .increment(1)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not write a KV block to the cold tier")
                    }
                }
            }
        }
    }

    /// The leading run of `wanted` some tier holds, decoded.
    async fn fetch(&mut self, wanted: &[(BlockHash, [u32; BLOCK_SIZE])]) -> Vec<FetchedBlock> {
        let start = Instant::now();
        let mut out = Vec::new();
        for &(hash, tokens) in wanted {
            let found = self.find(hash).await;
            let Some((block, tier)) = found.filter(|(b, _)| b.tokens == tokens) else {
                break;
            };
            let Some(data) = block
                .codec
                .decode(&block.bytes, self.layout.len, self.layout.group)
            else {
                break;
            };
            metrics::counter!(names::KV_TIER_HITS, "model" => self.label.clone(), "tier" => tier.as_str()).increment(1);
            out.push(FetchedBlock {
                hash,
                tokens,
                data,
                tier,
            });
        }
        if out.len() < wanted.len() {
            metrics::counter!(names::KV_TIER_MISSES, "model" => self.label.clone()).increment(1);
        }
        metrics::histogram!(names::KV_TIER_FETCH_DURATION, "model" => self.label.clone())
            .record(start.elapsed().as_secs_f64());
        out
    }

    /// `hash` from the highest tier holding it; a block found below warm is copied into warm.
    async fn find(&mut self, hash: BlockHash) -> Option<(StoredBlock, Tier)> {
        if let Some(b) = self.warm.get(hash) {
            return Some((b.clone(), Tier::Warm));
        }
        let (block, tier) = match self.cold.as_mut().and_then(|c| c.get(hash)) {
            Some(b) => (b, Tier::Cold),
            None => (self.shared.as_mut()?.get(hash).await?, Tier::Shared),
        };
        if self.warm.cap() > 0 {
            for down in self.warm.insert(block.clone()) {
                if let Some(cold) = &mut self.cold
                    && let Err(e) = cold.put(&down)
                {
                    tracing::warn!(error = %e, "could not write a KV block to the cold tier");
                }
            }
        }
        Some((block, tier))
    }

    fn publish(&self) {
        let warm = Tier::Warm.as_str();
        metrics::gauge!(names::KV_TIER_BYTES, "model" => self.label.clone(), "tier" => warm)
            .set(self.warm.bytes() as f64);
        metrics::gauge!(names::KV_TIER_BLOCKS, "model" => self.label.clone(), "tier" => warm)
            .set(self.warm.len() as f64);
        if let Some(cold) = &self.cold {
            let tier = Tier::Cold.as_str();
            metrics::gauge!(names::KV_TIER_BYTES, "model" => self.label.clone(), "tier" => tier)
                .set(cold.bytes() as f64);
            metrics::gauge!(names::KV_TIER_BLOCKS, "model" => self.label.clone(), "tier" => tier)
                .set(cold.len() as f64);
        }
    }
}

/// A name for a model's weights, for keys shared between processes: SHA-256 over the file's
/// size and its first and last megabyte (a checkpoint directory: its index, which holds every
/// shard's SHA-256), first 16 hex digits.
pub fn model_fingerprint(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut h = Sha256::new();
    if path.is_dir() {
        h.update(std::fs::read(path.join("model.safetensors.index.json"))?);
    } else {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        h.update(len.to_le_bytes());
        let mut buf = vec![0u8; (1 << 20).min(len as usize)];
        f.read_exact(&mut buf)?;
        h.update(&buf);
        f.seek(SeekFrom::End(-(buf.len() as i64)))?;
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let block = StoredBlock {
            hash: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            tokens: std::array::from_fn(|i| i as u32 * 3),
            codec: Codec::Int8,
            bytes: (0..300).map(|i| i as u8).collect(),
            heat: 0.25,
        };
        let mut r = block.to_record();
        r.extend_from_slice(b"next record");
        let (back, len) = StoredBlock::from_record(&r).unwrap();
        assert_eq!(back, block);
        assert_eq!(len, r.len() - 11);
        let mut bad = r.clone();
        bad[HEADER + 10] ^= 1;
        assert!(
            StoredBlock::from_record(&bad).is_none(),
            "a flipped payload bit"
        );
        assert!(
            StoredBlock::from_record(&r[..len - 1]).is_none(),
            "a torn record"
        );
        assert!(StoredBlock::from_record(b"OSKV1").is_none());
    }
}
