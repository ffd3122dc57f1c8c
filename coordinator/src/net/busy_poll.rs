//! Busy-polling: after a send, the event loop keeps its core for a moment
//! (`--busy-poll`, microseconds) instead of sleeping in `epoll_wait`.
//!
//! Why: on the hot path the answer to a send comes back within tens of
//! microseconds (a worker's answer, a client's next statement), and a
//! thread that sleeps for that gap pays twice — the peer's send must wake
//! it, and on a virtual machine an idle core that halted takes 10–20 µs to
//! run again (`perf sched`: pgbench waited 17.6 µs on average for its core
//! behind the coordinator). Polling through the gap saves both, as Linux's
//! `busy_poll` does for network devices.
//!
//! It must not take the core from other work: each round yields the CPU
//! (`sched_yield`), and a yield that took long — another task ran — means
//! the core is wanted, so polling stops for [`BACK_OFF`]. With nothing
//! sent for the window, the poller sleeps until the next send.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

/// A yield that returned later than this gave the core to another task.
const WANTED_AFTER: Duration = Duration::from_micros(50);
/// How long polling stops once the core was wanted by another task.
const BACK_OFF: Duration = Duration::from_millis(2);

/// One event loop's poller (thread-local: each event loop is one thread).
struct Poller {
    /// How long to poll after a send (zero: never).
    window: Cell<Duration>,
    /// Polling until then.
    until: Cell<Option<Instant>>,
    /// No polling before then (the core was wanted).
    resting_until: Cell<Option<Instant>>,
    /// The poll task, while it sleeps.
    asleep: RefCell<Option<Waker>>,
}

thread_local! {
    static POLLER: Poller = const {
        Poller {
            window: Cell::new(Duration::ZERO),
            until: Cell::new(None),
            resting_until: Cell::new(None),
            asleep: RefCell::new(None),
        }
    };
}

/// Runs on each event loop (spawned on its runtime): polls for `window`
/// after every send on this thread, sleeps otherwise. Returns at once
/// when `window` is zero.
pub async fn run(window: Duration) {
    if window.is_zero() {
        return;
    }
    POLLER.with(|poller| poller.window.set(window));
    loop {
        poll_fn(|context| {
            POLLER.with(|poller| {
                if poller
                    .until
                    .get()
                    .is_some_and(|until| Instant::now() < until)
                {
                    Poll::Ready(())
                } else {
                    poller.until.set(None);
                    *poller.asleep.borrow_mut() = Some(context.waker().clone());
                    Poll::Pending
                }
            })
        })
        .await;
        let before = Instant::now();
        std::thread::yield_now();
        let after = Instant::now();
        if after - before > WANTED_AFTER {
            POLLER.with(|poller| {
                poller.until.set(None);
                poller.resting_until.set(Some(after + BACK_OFF));
            });
        }
        // tokio runs a task that yielded after it has polled the reactor
        // without blocking (epoll_wait with a zero timeout): one poll of
        // every socket per round.
        tokio::task::yield_now().await;
    }
}

/// Called on every send: an answer is likely soon, so the event loop
/// polls for it (unless polling is off or resting).
pub fn sent() {
    POLLER.with(|poller| {
        let window = poller.window.get();
        if window.is_zero() {
            return;
        }
        let now = Instant::now();
        if poller.resting_until.get().is_some_and(|until| now < until) {
            return;
        }
        poller.until.set(Some(now + window));
        if let Some(waker) = poller.asleep.borrow_mut().take() {
            waker.wake();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU time of the calling thread (the kernel's schedstat, in ns).
    fn thread_cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        let nanos = stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .expect("time on CPU");
        Duration::from_nanos(nanos)
    }

    #[test]
    fn polls_after_a_send_then_sleeps() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            tokio::spawn(run(Duration::from_millis(20)));
            tokio::task::yield_now().await;
            // A send: the loop polls (keeps the thread busy) for the window.
            sent();
            let start = thread_cpu();
            tokio::time::sleep(Duration::from_millis(15)).await;
            let polling = thread_cpu() - start;
            // Then it sleeps: a quiet period costs (almost) nothing.
            tokio::time::sleep(Duration::from_millis(10)).await;
            let start = thread_cpu();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let quiet = thread_cpu() - start;
            assert!(
                polling >= Duration::from_millis(5),
                "polled only {polling:?} of 15 ms after a send"
            );
            assert!(
                quiet < Duration::from_millis(10),
                "used {quiet:?} of CPU in 100 ms without sends"
            );
        });
    }

    #[test]
    fn off_when_the_window_is_zero() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            tokio::spawn(run(Duration::ZERO));
            tokio::task::yield_now().await;
            sent();
            let start = thread_cpu();
            tokio::time::sleep(Duration::from_millis(50)).await;
            let used = thread_cpu() - start;
            assert!(
                used < Duration::from_millis(10),
                "used {used:?} with polling off"
            );
        });
    }
}
