//! Deterministic one-way flags and stalls.
//!
//! `tokio::sync::watch` spreads its waiters over eight `Notify`s chosen by tokio's per-runtime
//! random generator, which cannot be seeded, so the order in which it wakes waiters differs from
//! run to run. These use one `Notify`, whose waiters wake in the order they started waiting.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// A flag that is set once; tasks wait for it.
#[derive(Debug, Default)]
pub(crate) struct Flag {
    set: AtomicBool,
    notify: Notify,
}

impl Flag {
    pub(crate) fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Returns once the flag is set.
    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// A switch that holds callers while on.
#[derive(Debug, Default)]
pub struct Stall {
    on: AtomicBool,
    released: Notify,
    waiting: AtomicUsize,
}

impl Stall {
    /// From now on, [`Stall::pass`] waits until [`Stall::release`].
    pub fn stall(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// Lets every waiting caller (and later ones) through.
    pub fn release(&self) {
        self.on.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }

    /// Callers waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Whether callers are held now.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Returns at once unless stalled; then when released.
    pub async fn pass(&self) {
        if !self.on.load(Ordering::SeqCst) {
            return;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.waiting);
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.on.load(Ordering::SeqCst) {
                break;
            }
            notified.await;
        }
    }
}

/// Takes one off a count when dropped (also when the waiting future is dropped).
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
