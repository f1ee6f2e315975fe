//! The page cache under a mapped checkpoint file, as `bench stream --cold` needs it: drop a file's
//! pages so that the next reads come from the disk, and ask how much of it is still cached.
use super::weights::Shard;

/// Drop the file's pages from this process's mapping and then from the page cache (Linux's
/// `madvise(MADV_DONTNEED)` and `posix_fadvise(POSIX_FADV_DONTNEED)`; a page still mapped by
/// another process stays), so that the next reads come from the disk: `bench stream --cold`.
/// The mapping stays valid (its pages are read again on access). Errors: another system, or
/// the kernel refusing either call (naming the file).
pub fn drop_cached_pages(shard: &Shard) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let name = |e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("{}: {e}", shard.path.display()))
        };
        // SAFETY: MADV_DONTNEED on a read-only shared file mapping only drops this
        // process's page-table entries; later reads fault the same file bytes back in.
        unsafe {
            shard
                .map()
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        }
        .map_err(name)?;
        let f = std::fs::File::open(&shard.path).map_err(name)?;
        // SAFETY: a plain system call on an open descriptor.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            return Err(name(std::io::Error::from_raw_os_error(r)));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "{}: dropping cached pages needs Linux's posix_fadvise",
                shard.path.display()
            ),
        ))
    }
}

/// The fraction of the file's pages in the page cache (Linux's `mincore` over the mapping),
/// `None` on another system or when the kernel refuses.
pub fn cached_fraction(shard: &Shard) -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        let page = 4096usize;
        let n = shard.map().len().div_ceil(page);
        if n == 0 {
            return Some(0.0);
        }
        let mut v = vec![0u8; n];
        // SAFETY: the mapping is `shard.map().len()` bytes from its page-aligned start, and
        // `v` holds one byte per 4 KiB page of it (Linux's base page size on x86-64 and
        // arm64; a larger page only leaves later bytes of `v` unwritten, still zero).
        let r = unsafe {
            libc::mincore(
                shard.map().as_ptr() as *mut libc::c_void,
                shard.map().len(),
                v.as_mut_ptr(),
            )
        };
        (r == 0).then(|| v.iter().filter(|&&b| b & 1 == 1).count() as f64 / n as f64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = shard;
        None
    }
}
