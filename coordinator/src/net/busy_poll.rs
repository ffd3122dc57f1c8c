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
    /// Rounds polled so far (tests look at it).
    rounds: Cell<u64>,
}

thread_local! {
    static POLLER: Poller = const {
        Poller {
            window: Cell::new(Duration::ZERO),
            until: Cell::new(None),
            resting_until: Cell::new(None),
            asleep: RefCell::new(None),
            rounds: Cell::new(0),
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
                    poller.rounds.set(poller.rounds.get() + 1);
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

    fn rounds() -> u64 {
        POLLER.with(|poller| poller.rounds.get())
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Lets the runtime run for `duration` (timers, the poller).
    async fn pause(duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    #[test]
    fn polls_after_a_send_then_sleeps() {
        runtime().block_on(async {
            tokio::spawn(run(Duration::from_millis(5)));
            pause(Duration::from_millis(1)).await;
            assert_eq!(rounds(), 0, "polled before any send");
            sent();
            pause(Duration::from_millis(3)).await;
            assert!(rounds() > 0, "no polling after a send");
            // Past the window (and a rest, should a yield have been slow):
            // asleep, and no round happens without another send.
            pause(Duration::from_millis(20)).await;
            let asleep = rounds();
            pause(Duration::from_millis(50)).await;
            assert_eq!(rounds(), asleep, "polled without a send");
            // The next send wakes it again (once any rest is over).
            sent();
            pause(Duration::from_millis(3)).await;
            assert!(rounds() > asleep, "a later send did not wake the poller");
        });
    }

    #[test]
    fn off_when_the_window_is_zero() {
        runtime().block_on(async {
            tokio::spawn(run(Duration::ZERO));
            pause(Duration::from_millis(1)).await;
            sent();
            pause(Duration::from_millis(20)).await;
            assert_eq!(rounds(), 0, "polled with a zero window");
        });
    }
}
