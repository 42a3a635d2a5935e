//! Data-parallel helpers over rayon's pool.

use std::ops::Range;

use rayon::prelude::*;

/// Calls `f` on consecutive ranges covering `0..n`, in parallel, each at most `grain` long.
pub fn for_each_range(n: usize, grain: usize, f: impl Fn(Range<usize>) + Sync + Send) {
    let grain = grain.max(1);
    let chunks = n.div_ceil(grain);
    if chunks <= 1 {
        if n > 0 {
            f(0..n);
        }
        return;
    }
    (0..chunks)
        .into_par_iter()
        .for_each(|c| f(c * grain..((c + 1) * grain).min(n)));
}

/// A grain that splits `n` items into about `tasks_per_thread` tasks per pool thread, but
/// never fewer than `min` items per task.
pub fn grain_for(n: usize, min: usize, tasks_per_thread: usize) -> usize {
    let tasks = rayon::current_num_threads() * tasks_per_thread;
    n.div_ceil(tasks.max(1)).max(min)
}

/// A raw pointer to an output buffer that parallel tasks write in disjoint places.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(*mut T);

// SAFETY: users uphold that concurrent writers touch disjoint elements (see `write`).
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// Wraps `slice` for disjoint parallel writes.
    pub fn new(slice: &mut [T]) -> Self {
        Self(slice.as_mut_ptr())
    }

    /// Writes `value` at `index`.
    ///
    /// # Safety
    /// `index` is in bounds of the wrapped slice, the slice outlives every use, and no other
    /// task reads or writes `index` concurrently.
    #[inline(always)]
    pub unsafe fn write(self, index: usize, value: T) {
        // SAFETY: guaranteed by the caller.
        unsafe { self.0.add(index).write(value) }
    }

    /// A mutable view of `len` elements starting at `start`.
    ///
    /// # Safety
    /// As for [`SharedMut::write`], for every element of the range.
    #[inline(always)]
    pub unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}
