//! A guard against one way a malformed request could crash the process.
//!
//! `kafka-protocol` 0.18 decodes an array by reading its element count from the wire and calling
//! `Vec::with_capacity(count)` before decoding any element. A crafted count (up to 2³¹ or 2³²) asks for
//! hundreds of gigabytes; the system allocator refuses, and Rust aborts the process on a failed
//! allocation. The decode itself would fail a moment later (the frame holds far fewer bytes than the
//! count claims) and free the vector, having touched only a few pages of it.
//!
//! So allocations of at least [`HUGE`] bytes — which this broker never needs otherwise: requests
//! are capped at 100 MiB — are served by an anonymous `mmap` with `MAP_NORESERVE`: address space only,
//! no memory is committed until touched. Everything else goes to the system allocator unchanged.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations from this size on are mapped lazily.
const HUGE: usize = 1 << 30;
/// `mmap` alignment.
const PAGE: usize = 4096;

/// The process's global allocator (see the module documentation).
#[derive(Debug)]
pub struct GuardedAllocator;

// SAFETY: every pointer is either from `System` (sizes below HUGE, freed by `System`) or from `mmap`
// (sizes from HUGE on, page-aligned, freed by `munmap` with the same size): the layout passed to
// `dealloc`/`realloc` is the one of the allocation, so the routing is the same on both sides.
unsafe impl GlobalAlloc for GuardedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() < HUGE || layout.align() > PAGE {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc(layout) };
        }
        // SAFETY: an anonymous private mapping; no memory of ours is aliased.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() < HUGE || layout.align() > PAGE {
            // SAFETY: allocated by `System` with this layout (see `alloc`).
            unsafe { System.dealloc(ptr, layout) };
            return;
        }
        // SAFETY: mapped by `alloc` with this size.
        unsafe { libc::munmap(ptr.cast(), layout.size()) };
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() < HUGE || layout.align() > PAGE {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // Anonymous mappings are zero-filled.
        // SAFETY: same as `alloc`.
        unsafe { self.alloc(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old_huge = layout.size() >= HUGE && layout.align() <= PAGE;
        let new_huge = new_size >= HUGE && layout.align() <= PAGE;
        if !old_huge && !new_huge {
            // SAFETY: both sides are `System`'s.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: the new layout is valid (same alignment, size checked by the caller).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: allocate, copy the common prefix, free the old block (routed by its layout).
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_huge_capacity_does_not_abort() {
        // 2^31 elements of 64 bytes: far more than any test machine has.
        let v: Vec<[u8; 64]> = Vec::with_capacity(i32::MAX as usize);
        assert!(v.capacity() >= i32::MAX as usize);
        let mut small = vec![1u8; 10];
        small.reserve(HUGE_TEST);
        small.push(2);
        assert_eq!(small[..11], [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]);
        small.shrink_to_fit();
        assert_eq!(small.len(), 11);
    }

    const HUGE_TEST: usize = super::HUGE * 2;
}
