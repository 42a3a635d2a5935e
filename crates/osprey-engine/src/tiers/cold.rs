//! The cold tier: blocks on local disk, in append-only segment files, within a byte cap.
//!
//! ```text
//! DIR/seg-000001.kv   record record record …   (each: a checksummed StoredBlock record)
//! DIR/seg-000002.kv   …                         (a new segment every SEGMENT_BYTES)
//! ```
//! An index in memory maps each block's hash to its record. At start the segments are scanned
//! to rebuild it; a record whose checksum fails (a torn write, a flipped bit) ends the scan of
//! its segment, and a read that fails its checksum is a miss that forgets the record. Over the
//! cap, the oldest segment is deleted whole (first in, first out).
//!
//! The tier is a cache sharing its disk with things that are not (the store, logs): it leaves
//! [`FREE_RESERVE`] of the filesystem free, giving back its oldest segments when others fill the
//! disk and writing nothing while it has none left to give, and a write that fails (the disk
//! full after all) is cut off rather than left as a torn record.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::StoredBlock;
use crate::kv::BlockHash;

/// A segment is closed once it reaches this size.
const SEGMENT_BYTES: u64 = 64 << 20;

/// The share of its filesystem the cold tier leaves free for others ...
pub const FREE_RESERVE: f64 = 0.10;
/// ... but never more than this many bytes (10% of a large disk is more than others need).
pub const MAX_FREE_RESERVE: u64 = 1 << 30;

struct Location {
    segment: u64,
    offset: u64,
    len: u32,
}

/// Blocks in segment files under one directory.
pub struct ColdStore {
    dir: PathBuf,
    cap_bytes: u64,
    index: HashMap<BlockHash, Location>,
    /// Segment numbers with their sizes, oldest first.
    segments: Vec<(u64, u64)>,
    /// The segment being appended to.
    writer: Option<(u64, File)>,
    /// Bytes free and in all on the filesystem of a directory.
    space: fn(&Path) -> std::io::Result<(u64, u64)>,
}

/// Bytes free (to an unprivileged writer) and in all on the filesystem of `dir`.
fn filesystem_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    let fs = rustix::fs::statvfs(dir)?;
    Ok((fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize))
}

impl ColdStore {
    /// Opens (or creates) the store in `dir`, reading back what earlier runs wrote.
    pub fn open(dir: &Path, cap_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut numbers: Vec<u64> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| segment_number(&e.file_name().to_string_lossy()))
            .collect();
        numbers.sort_unstable();
        let mut store = Self {
            dir: dir.to_owned(),
            cap_bytes,
            index: HashMap::new(),
            segments: Vec::new(),
            writer: None,
            space: filesystem_space,
        };
        for n in numbers {
            let len = store.scan(n)?;
            store.segments.push((n, len));
        }
        store.enforce_cap()?;
        Ok(store)
    }

    /// Bytes on disk.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.1).sum()
    }

    /// Blocks indexed.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether `hash` is stored (it may still fail its checksum when read).
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.index.contains_key(&hash)
    }

    /// Appends `block`; the index sees it only once it is written whole.
    pub fn put(&mut self, block: &StoredBlock) -> std::io::Result<()> {
        if self.index.contains_key(&block.hash) {
            return Ok(());
        }
        let record = block.to_record();
        if !self.make_room(record.len() as u64)? {
            tracing::debug!("the disk is nearly full: a KV block is not kept in the cold tier");
            return Ok(());
        }
        let (segment, file) = self.writer()?;
        let offset = file.seek(SeekFrom::End(0))?;
        if let Err(e) = file.write_all(&record) {
            // What was written of it would be a torn record that ends the segment's scan.
            let _ = file.set_len(offset);
            return Err(e);
        }
        let segment = *segment;
        let last = self
            .segments
            .last_mut()
            .expect("the writer's segment is listed");
        last.1 = offset + record.len() as u64;
        self.index.insert(
            block.hash,
            Location {
                segment,
                offset,
                len: record.len() as u32,
            },
        );
        if last.1 >= SEGMENT_BYTES {
            self.writer = None;
        }
        self.enforce_cap()
    }

    /// Reads `hash` back; a record that is missing, short or fails its checksum is a miss (and
    /// is forgotten).
    pub fn get(&mut self, hash: BlockHash) -> Option<StoredBlock> {
        let loc = self.index.get(&hash)?;
        let read = || -> std::io::Result<Vec<u8>> {
            let mut f = File::open(self.segment_path(loc.segment))?;
            f.seek(SeekFrom::Start(loc.offset))?;
            let mut buf = vec![0u8; loc.len as usize];
            f.read_exact(&mut buf)?;
            Ok(buf)
        };
        let block = read()
            .ok()
            .and_then(|buf| StoredBlock::from_record(&buf).map(|(b, _)| b))
            .filter(|b| b.hash == hash);
        if block.is_none() {
            tracing::warn!(
                hash = format!("{hash:032x}"),
                "a cold KV block failed its checksum; treated as a miss"
            );
            self.index.remove(&hash);
        }
        block
    }

    fn segment_path(&self, n: u64) -> PathBuf {
        self.dir.join(format!("seg-{n:06}.kv"))
    }

    fn writer(&mut self) -> std::io::Result<&mut (u64, File)> {
        if self.writer.is_none() {
            let n = self.segments.last().map_or(1, |s| s.0 + 1);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.segment_path(n))?;
            self.segments.push((n, 0));
            self.writer = Some((n, file));
        }
        Ok(self.writer.as_mut().expect("just opened"))
    }

    /// Indexes segment `n`'s records up to the first bad one; returns its size.
    fn scan(&mut self, n: u64) -> std::io::Result<u64> {
        let data = std::fs::read(self.segment_path(n))?;
        let mut offset = 0;
        while let Some((block, len)) = StoredBlock::from_record(&data[offset..]) {
            self.index.insert(
                block.hash,
                Location {
                    segment: n,
                    offset: offset as u64,
                    len: len as u32,
                },
            );
            offset += len;
        }
        if offset < data.len() {
            tracing::warn!(
                segment = n,
                valid = offset,
                bytes = data.len(),
                "a cold KV segment ends in a torn or corrupt record; the rest is ignored"
            );
        }
        Ok(data.len() as u64)
    }

    /// Deletes the oldest segments while over the cap.
    fn enforce_cap(&mut self) -> std::io::Result<()> {
        while self.bytes() > self.cap_bytes && !self.segments.is_empty() {
            self.delete_oldest()?;
        }
        Ok(())
    }

    /// Whether `len` more bytes leave the reserve ([`FREE_RESERVE`], at most [`MAX_FREE_RESERVE`])
    /// of the filesystem free, after deleting
    /// the oldest segments as needed.
    fn make_room(&mut self, len: u64) -> std::io::Result<bool> {
        loop {
            let (free, total) = (self.space)(&self.dir)?;
            let reserve = (FREE_RESERVE * total as f64).min(MAX_FREE_RESERVE as f64);
            if free.saturating_sub(len) as f64 >= reserve {
                return Ok(true);
            }
            if self.segments.is_empty() {
                return Ok(false);
            }
            self.delete_oldest()?;
        }
    }

    fn delete_oldest(&mut self) -> std::io::Result<()> {
        let (n, _) = self.segments.remove(0);
        if self.writer.as_ref().is_some_and(|w| w.0 == n) {
            self.writer = None;
        }
        self.index.retain(|_, loc| loc.segment != n);
        std::fs::remove_file(self.segment_path(n))
    }
}

fn segment_number(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?.strip_suffix(".kv")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::codec::Codec;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A store whose disk always has room, whatever the host's disk holds.
    fn roomy(dir: &Path, cap: u64) -> ColdStore {
        let mut s = ColdStore::open(dir, cap).unwrap();
        s.space = |_| Ok((1 << 40, 1 << 40));
        s
    }

    fn dir(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("osprey-cold-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Dir(p)
    }

    fn block(hash: BlockHash) -> StoredBlock {
        StoredBlock {
            hash,
            tokens: [7; 16],
            codec: Codec::F16,
            bytes: (0..1000).map(|i| (i as u128 * hash) as u8).collect(),
            heat: 0.5,
        }
    }

    #[test]
    fn blocks_survive_a_restart() {
        let d = dir("restart");
        let mut s = roomy(&d.0, 1 << 20);
        s.put(&block(1)).unwrap();
        s.put(&block(2)).unwrap();
        drop(s);
        let mut s = roomy(&d.0, 1 << 20);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(2).unwrap().bytes, block(2).bytes);
    }

    #[test]
    fn a_corrupt_or_torn_record_is_a_miss_not_a_crash() {
        let d = dir("corrupt");
        let mut s = roomy(&d.0, 1 << 20);
        for h in 1..=3 {
            s.put(&block(h)).unwrap();
        }
        let seg = d.0.join("seg-000001.kv");
        let mut data = std::fs::read(&seg).unwrap();
        let record = data.len() / 3;
        data[record + 200] ^= 0xff; // a bit flip inside the second record
        std::fs::write(&seg, &data).unwrap();
        assert!(s.get(2).is_none(), "the checksum catches it");
        assert!(s.get(1).is_some() && s.get(3).is_some());
        // A torn write: the file ends halfway through the third record.
        std::fs::write(&seg, &data[..2 * record + record / 2]).unwrap();
        let mut s = roomy(&d.0, 1 << 20);
        assert!(s.get(1).is_some());
        assert!(s.get(2).is_none() && s.get(3).is_none());
    }

    #[test]
    fn the_oldest_segment_goes_when_over_the_cap() {
        let d = dir("cap");
        let record = block(1).to_record().len() as u64;
        let mut s = roomy(&d.0, 2 * record);
        s.put(&block(1)).unwrap();
        s.writer = None; // close the segment, as a full one would be
        s.put(&block(2)).unwrap();
        s.writer = None;
        s.put(&block(3)).unwrap();
        assert!(!s.contains(1), "segment 1 was deleted");
        assert!(s.contains(2) && s.contains(3));
        assert!(s.bytes() <= 2 * record);
    }

    #[test]
    fn the_tier_gives_its_disk_back_when_others_fill_it() {
        let d = dir("reserve");
        let mut s = ColdStore::open(&d.0, 1 << 20).unwrap();
        // A 1 MiB disk with 10% left to others as long as the tier's segments are under 900 KiB
        // and the rest of the disk is empty; then something else fills 950 KiB of it.
        s.space = |dir| {
            let ours: u64 = std::fs::read_dir(dir)?
                .map(|e| e.and_then(|e| e.metadata()).map_or(0, |m| m.len()))
                .sum();
            let others = if dir.join("full").exists() {
                950 << 10
            } else {
                0
            };
            Ok(((1u64 << 20).saturating_sub(ours + others), 1 << 20))
        };
        s.put(&block(1)).unwrap();
        s.writer = None;
        s.put(&block(2)).unwrap();
        assert!(s.contains(1) && s.contains(2));
        std::fs::write(d.0.join("full"), b"").unwrap();
        s.put(&block(3)).unwrap();
        assert!(
            !s.contains(1) && !s.contains(2) && !s.contains(3),
            "every segment given back, and the new block not kept"
        );
        assert_eq!(s.bytes(), 0);
        std::fs::remove_file(d.0.join("full")).unwrap();
        s.put(&block(4)).unwrap();
        assert!(s.contains(4), "kept again once there is room");
    }
}
