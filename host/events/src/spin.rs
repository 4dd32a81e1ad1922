//! The lock that orders emitting threads onto the staging ring.
//!
//! One thread (the scheduling loop) emits nearly every event, so the lock is all but uncontended;
//! what it costs is its memory-ordering side. `std::sync::Mutex` releases with an atomic swap, on
//! x86 a full barrier that waits until the event's stores have reached the drainer's CPU: ~0.4 %
//! of a 14 µs decision in `wasmsched bench` (BENCHMARKS.md, session 23). Releasing this lock is a
//! plain store, so those stores drain while scheduling goes on. Waiters spin briefly, then yield:
//! the critical section is one ring push and never blocks, so a waiter waits at most for a
//! preempted holder to run again.

// The one module of the crate with `unsafe`: the lock's cell.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Spins this many times before yielding the CPU.
const SPINS: u32 = 64;

pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, and `locked` admits one guard at a time;
// the acquire/release pair orders each holder's accesses after the previous holder's. Like a
// mutex, sharing the lock hands the value from thread to thread, hence `T: Send`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// Holds the lock; releases it when dropped.
pub(crate) struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Makes the guard `Sync` only where `T` is: a shared guard hands out `&T` to every thread
    /// that holds it (`&SpinLock<T>` alone would make it `Sync` for any `T: Send`).
    _access: PhantomData<&'a mut T>,
}

impl<T> SpinLock<T> {
    pub(crate) fn new(value: T) -> Self {
        SpinLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    #[inline]
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        Guard { lock: self, _access: PhantomData }
    }
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock (see `Sync` above).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_exclude_each_other() {
        // A non-atomic read-modify-write under the lock: any overlap of two holders loses counts.
        let lock = SpinLock::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50_000 {
                        let mut count = lock.lock();
                        *count = std::hint::black_box(*count) + 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), 200_000);
    }
}
