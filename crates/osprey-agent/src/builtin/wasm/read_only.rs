//! The operator's granted directory as a module sees it: it may list, stat and read, never
//! create, write, rename or remove. Every change is refused here, before the host is asked.

use std::any::Any;
use std::path::PathBuf;

use wasmi_wasi::wasi_common::dir::{OpenResult, ReaddirCursor, ReaddirEntity, WasiDir};
use wasmi_wasi::wasi_common::file::{FdFlags, Filestat, OFlags};
use wasmi_wasi::wasi_common::{Error, ErrorExt};

/// A directory (and every directory below it) open for reading only.
pub struct ReadOnlyDir(Box<dyn WasiDir>);

impl ReadOnlyDir {
    /// `dir`, read-only.
    pub fn new(dir: wasmi_wasi::Dir) -> Self {
        Self(Box::new(
            wasmi_wasi::wasi_common::sync::dir::Dir::from_cap_std(dir),
        ))
    }
}

/// Whether opening a file this way could change anything.
fn writes(oflags: OFlags, write: bool, fdflags: FdFlags) -> bool {
    write
        || oflags.intersects(OFlags::CREATE | OFlags::TRUNCATE)
        || fdflags.contains(FdFlags::APPEND)
}

// The methods not listed keep the trait's default: refused as not supported.
#[async_trait::async_trait]
impl WasiDir for ReadOnlyDir {
    fn as_any(&self) -> &dyn Any {
        self
    }

    async fn open_file(
        &self,
        symlink_follow: bool,
        path: &str,
        oflags: OFlags,
        read: bool,
        write: bool,
        fdflags: FdFlags,
    ) -> Result<OpenResult, Error> {
        if writes(oflags, write, fdflags) {
            return Err(Error::perm());
        }
        let opened = (self.0)
            .open_file(symlink_follow, path, oflags, read, false, fdflags)
            .await?;
        Ok(match opened {
            OpenResult::Dir(dir) => OpenResult::Dir(Box::new(Self(dir))),
            file => file,
        })
    }

    async fn readdir(
        &self,
        cursor: ReaddirCursor,
    ) -> Result<Box<dyn Iterator<Item = Result<ReaddirEntity, Error>> + Send>, Error> {
        self.0.readdir(cursor).await
    }

    async fn read_link(&self, path: &str) -> Result<PathBuf, Error> {
        self.0.read_link(path).await
    }

    async fn get_filestat(&self) -> Result<Filestat, Error> {
        self.0.get_filestat().await
    }

    async fn get_path_filestat(
        &self,
        path: &str,
        follow_symlinks: bool,
    ) -> Result<Filestat, Error> {
        self.0.get_path_filestat(path, follow_symlinks).await
    }
}
