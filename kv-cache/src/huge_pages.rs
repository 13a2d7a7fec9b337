//! Asks Linux to back large cache tensors with transparent huge pages.
//!
//! Paged attention visits blocks in block-table order, i.e. anywhere in the pool: with 4 KiB
//! pages nearly every block costs a TLB miss whose page walk itself misses the cache. With 2 MiB
//! pages a GiB-sized cache fits in the TLB. The advice must come before the first touch, so
//! tensors are allocated zeroed (untouched `calloc`/`mmap` pages) and advised right away.

/// Advises huge pages for `buf`'s memory; a hint — failure (or another OS) changes nothing.
pub(crate) fn advise<T>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        const MADV_HUGEPAGE: i32 = 14;
        const WORTH_IT: usize = 4 << 20;
        unsafe extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        let (start, len) = (buf.as_mut_ptr() as usize, std::mem::size_of_val(buf));
        if len < WORTH_IT {
            return;
        }
        let aligned = start.next_multiple_of(PAGE);
        let span = (len - (aligned - start)) & !(PAGE - 1);
        // SAFETY: the range lies inside `buf`'s allocation, page-aligned; MADV_HUGEPAGE changes
        // no contents and no mapping, only how future faults are served.
        let _ = unsafe { madvise(aligned as *mut std::ffi::c_void, span, MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}
