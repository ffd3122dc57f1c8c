//! Multiplexed reads: autocommit single-shard SELECTs of many clients share
//! one server connection per worker (a *pipe*), their requests pipelined.
//!
//! Why: on the hot path a proxy's cost is per round trip — a send, a
//! wakeup and a receive on each side, in the coordinator and in the server
//! backend. Requests of clients that arrive together go to the worker in
//! one write; its backend reads them in one receive and answers them one
//! after another without sleeping in between.
//!
//! Only statements that leave nothing behind on the connection and do not
//! wait for row locks come here (the session decides: plain SELECTs routed
//! to one worker, outside transactions). Answers come back in request
//! order, so they are read in turn: the client whose request is next on
//! the wire holds the connection while it relays its answer, then hands it
//! on. A client whose turn has not come within [`TURN_TIMEOUT`] (a slow
//! statement ahead of it) gives up its place and runs its statement on a
//! pooled connection; a drain task reads and drops its answer on the pipe.
//! A pipe whose oldest request has waited longer than [`SLOW_HEAD`] takes
//! no more requests until it catches up.

use crate::backend::connection::{BackendError, ServerConnection};
use crate::backend::pool::{self, PoolKey};
use crate::metrics::NodeStats;
use crate::net::protocol;
use crate::net::socket::{self, Inner};
use crate::net::tags;
use bytes::BytesMut;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::poll_fn;
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};
use tokio::io::Interest;

/// How long a request waits for the answers ahead of it before it runs on
/// a pooled connection instead (checked every [`WATCH_TICK`]).
const TURN_TIMEOUT: Duration = Duration::from_millis(10);
/// How often a pipe's watchdog looks at its oldest request. One steady
/// ticker per pipe rather than a timer per request: registering a timer
/// that is due before the runtime's next wakeup costs a system call.
const WATCH_TICK: Duration = Duration::from_millis(5);
/// A watchdog that saw no request for this long sleeps until the next one.
const WATCH_IDLE: Duration = Duration::from_secs(1);
/// A pipe whose oldest unanswered request is older than this takes no new
/// ones (they use pooled connections).
const SLOW_HEAD: Duration = Duration::from_millis(2);
/// Most requests in flight on one pipe.
const MOST_IN_FLIGHT: usize = 64;
/// Most statements prepared on a pipe's connection.
const MOST_PREPARED: usize = 2000;
/// A pipe that failed is not opened again for this long.
const REOPEN_AFTER: Duration = Duration::from_secs(1);
/// Most pipes (distinct node, database, user and settings).
const MOST_PIPES: usize = 256;

/// A pipe serves clients with the same server, database, user and settings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PipeKey {
    pub pool: PoolKey,
    /// The client's SET statements, replayed once when the pipe opens.
    pub settings: Vec<(String, String)>,
    /// Which of the pipes for the same server, database, user and settings
    /// (`--multiplex-connections`).
    pub lane: usize,
}

/// Every pipe of the coordinator.
pub struct Pipes {
    pipes: Mutex<HashMap<PipeKey, Arc<Pipe>>>,
    password: Option<String>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Pipes {
    pub fn new(password: Option<String>, metrics: Arc<crate::metrics::Metrics>) -> Pipes {
        Pipes {
            pipes: Mutex::new(HashMap::new()),
            password,
            metrics,
        }
    }

    /// The pipe for `key` if it is open; otherwise starts opening one
    /// (the caller uses a pooled connection meanwhile).
    pub fn get(&self, key: &PipeKey) -> Option<Arc<Pipe>> {
        let mut pipes = self.pipes.lock().ok()?;
        if let Some(pipe) = pipes.get(key) {
            let reopen = match pipe.phase() {
                Phase::Open => return Some(pipe.clone()),
                Phase::Opening => false,
                Phase::Closed(at) => at.elapsed() >= REOPEN_AFTER,
            };
            if !reopen {
                return None;
            }
        } else if pipes.len() >= MOST_PIPES {
            return None;
        }
        let pipe = Arc::new(Pipe::new(
            key.clone(),
            self.metrics.node(&key.pool.address.to_string()),
        ));
        pipes.insert(key.clone(), pipe.clone());
        tokio::spawn(pipe.open(self.password.clone()));
        None
    }

    /// Open pipes, for SHOW POOLS: (key, requests in flight, statements served).
    pub fn summary(&self) -> Vec<(PipeKey, usize, u64)> {
        self.pipes
            .lock()
            .map(|pipes| {
                pipes
                    .values()
                    .filter(|pipe| matches!(pipe.phase(), Phase::Open))
                    .map(|pipe| {
                        let state = pipe.lock();
                        (pipe.key.clone(), state.in_flight.len(), state.served)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Clone, Copy)]
enum Phase {
    Opening,
    Open,
    /// Failed or shut; when.
    Closed(Instant),
}

/// One shared server connection and the requests in flight on it.
pub struct Pipe {
    pub key: PipeKey,
    /// The server's statement counters.
    pub stats: Arc<NodeStats>,
    state: Mutex<State>,
    /// Wakes a sleeping watchdog.
    watch: tokio::sync::Notify,
    /// Requests in flight, readable without the lock (to pick the least
    /// busy lane).
    load: std::sync::atomic::AtomicUsize,
}

struct State {
    phase: Phase,
    /// Present while no client holds it (between turns).
    connection: Option<ServerConnection>,
    /// The write side (a second descriptor of the same socket), absent
    /// while a flush is writing.
    writer: Option<Inner>,
    /// Requests queued and not yet written.
    pending: BytesMut,
    flushing: bool,
    next_ticket: u64,
    /// Unanswered requests in wire order; the front one's answer is next.
    in_flight: VecDeque<Request>,
    /// Clients waiting for their turn, by ticket.
    waiters: HashMap<u64, Waker>,
    /// Requests told to give up their place (the answers ahead are slow).
    give_up: HashSet<u64>,
    /// When a request was last queued, and whether the watchdog sleeps
    /// until the next one (woken through `watch`).
    last_queued: Instant,
    watchdog_asleep: bool,
    /// Statements prepared on the connection, and those whose Parse is in
    /// flight (not usable by other requests until it has succeeded).
    prepared: HashSet<String>,
    preparing: HashSet<String>,
    /// The map version declared last in the request stream.
    map_version: i64,
    /// Requests answered.
    served: u64,
}

struct Request {
    ticket: u64,
    queued: Instant,
    /// ReadyForQuery messages that end its answer.
    answers: usize,
    /// Statements its Parse messages prepare.
    prepares: Vec<String>,
    /// Its client went elsewhere; a drain task reads the answer.
    abandoned: bool,
}

/// A request's place on a pipe. Dropped before its turn came, it gives
/// the place up (its answer is read and dropped).
pub struct Ticket {
    pipe: Arc<Pipe>,
    id: u64,
    /// A `SET pg_shard.map_version` was put before the request: its answer
    /// (one ReadyForQuery) comes first.
    pub declared_version: bool,
    waiting: bool,
}

/// The pipe's connection, held while reading one request's answer. Dropped
/// without [`Turn::finish`] (the answer not read to its end), it closes the
/// pipe.
pub struct Turn {
    pipe: Arc<Pipe>,
    id: u64,
    connection: Option<ServerConnection>,
}

/// A request built for a pipe.
pub struct Built {
    pub bytes: BytesMut,
    /// ReadyForQuery messages its answer holds.
    pub answers: usize,
    /// Named statements its Parse messages prepare.
    pub prepares: Vec<String>,
}

impl Pipe {
    fn new(key: PipeKey, stats: Arc<NodeStats>) -> Pipe {
        Pipe {
            key,
            stats,
            watch: tokio::sync::Notify::new(),
            load: std::sync::atomic::AtomicUsize::new(0),
            state: Mutex::new(State {
                phase: Phase::Opening,
                connection: None,
                writer: None,
                pending: BytesMut::new(),
                flushing: false,
                next_ticket: 0,
                in_flight: VecDeque::new(),
                waiters: HashMap::new(),
                give_up: HashSet::new(),
                last_queued: Instant::now(),
                watchdog_asleep: false,
                prepared: HashSet::new(),
                preparing: HashSet::new(),
                map_version: 0,
                served: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough state
        // (every method keeps it valid between statements).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn phase(&self) -> Phase {
        self.lock().phase
    }

    pub fn is_open(&self) -> bool {
        matches!(self.phase(), Phase::Open)
    }

    /// Requests in flight.
    pub fn load(&self) -> usize {
        self.load.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Connects, replays the settings and opens the pipe.
    async fn open(self: Arc<Self>, password: Option<String>) {
        let opened = async {
            let mut connection = pool::connect(&self.key.pool, password.as_deref()).await?;
            if !self.key.settings.is_empty() {
                let text: Vec<&str> = self.key.settings.iter().map(|(_, s)| s.as_str()).collect();
                let mut out = BytesMut::new();
                protocol::query(&mut out, &text.join(";\n"));
                connection.write(&out).await?;
                loop {
                    let (tag, body) = connection.read().await?;
                    match tag {
                        tags::backend::ERROR_RESPONSE => {
                            return Err(BackendError::Refused(protocol::ServerError::parse(&body)))
                        }
                        tags::backend::READY_FOR_QUERY => break,
                        _ => {}
                    }
                }
            }
            let writer = connection.clone_stream()?;
            Ok::<_, BackendError>((connection, writer))
        }
        .await;
        let mut state = self.lock();
        match opened {
            Ok((connection, writer)) => {
                state.connection = Some(connection);
                state.writer = Some(writer);
                state.phase = Phase::Open;
                tokio::spawn(self.clone().watchdog());
            }
            Err(e) => {
                tracing::info!(server = %self.key.pool.address, error = %e, "multiplexed connection not opened");
                state.phase = Phase::Closed(Instant::now());
            }
        }
    }

    /// Queues a request built by `build` (under the pipe's lock, so that
    /// what it sees prepared stays true), declaring `map_version` first
    /// when the stream has another. None when the pipe cannot take it.
    pub fn enqueue(
        self: &Arc<Self>,
        map_version: i64,
        build: impl FnOnce(&HashSet<String>) -> Option<Built>,
    ) -> Option<Ticket> {
        let mut state = self.lock();
        if !matches!(state.phase, Phase::Open) || state.in_flight.len() >= MOST_IN_FLIGHT {
            return None;
        }
        if state
            .in_flight
            .front()
            .is_some_and(|head| head.queued.elapsed() > SLOW_HEAD)
        {
            return None;
        }
        // What the connection will have prepared when the request runs.
        let built = build(&state.prepared)?;
        // A statement another request is still preparing may not exist
        // when this one runs; too many prepared ones cost server memory.
        if built.prepares.iter().any(|n| state.preparing.contains(n))
            || state.prepared.len() + built.prepares.len() > MOST_PREPARED
        {
            return None;
        }
        let declared_version = map_version > 0 && state.map_version != map_version;
        let mut answers = built.answers;
        if declared_version {
            protocol::query(
                &mut state.pending,
                &format!("SET pg_shard.map_version = {map_version}"),
            );
            state.map_version = map_version;
            answers += 1;
        }
        state.pending.extend_from_slice(&built.bytes);
        state.preparing.extend(built.prepares.iter().cloned());
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let now = Instant::now();
        state.last_queued = now;
        if state.watchdog_asleep {
            state.watchdog_asleep = false;
            self.watch.notify_one();
        }
        self.load.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        state.in_flight.push_back(Request {
            ticket,
            queued: now,
            answers,
            prepares: built.prepares,
            abandoned: false,
        });
        if !state.flushing {
            state.flushing = true;
            // Runs after the clients woken with this one have queued theirs:
            // one write for all of them.
            tokio::spawn(self.clone().flush());
        }
        Some(Ticket {
            pipe: self.clone(),
            id: ticket,
            declared_version,
            waiting: true,
        })
    }

    /// Writes what is queued until nothing is.
    async fn flush(self: Arc<Self>) {
        loop {
            let (bytes, writer) = {
                let mut state = self.lock();
                if state.pending.is_empty() || !matches!(state.phase, Phase::Open) {
                    state.flushing = false;
                    return;
                }
                let Some(writer) = state.writer.take() else {
                    state.flushing = false;
                    return;
                };
                (state.pending.split(), writer)
            };
            match write_all(writer, &bytes).await {
                Ok(writer) => self.lock().writer = Some(writer),
                Err(e) => {
                    tracing::info!(server = %self.key.pool.address, error = %e, "multiplexed connection lost");
                    let mut state = self.lock();
                    state.flushing = false;
                    close(&mut state);
                    return;
                }
            }
        }
    }

    /// Resolves when the answer to `id` is next, with the connection to
    /// read it from; None when the pipe closed or (for a client's request)
    /// the watchdog told it to give up.
    async fn front(&self, id: u64) -> Option<ServerConnection> {
        poll_fn(|context| {
            let mut state = self.lock();
            if !matches!(state.phase, Phase::Open) || state.give_up.remove(&id) {
                return Poll::Ready(None);
            }
            if state.in_flight.front().map(|r| r.ticket) == Some(id) {
                if let Some(connection) = state.connection.take() {
                    state.waiters.remove(&id);
                    return Poll::Ready(Some(connection));
                }
            }
            state.waiters.insert(id, context.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Tells the requests waiting behind a slow one to go elsewhere, until
    /// the pipe closes. Sleeps while the pipe is idle.
    async fn watchdog(self: Arc<Self>) {
        let mut tick = tokio::time::interval(WATCH_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let asleep = {
                let mut state = self.lock();
                if !matches!(state.phase, Phase::Open) {
                    return;
                }
                let slow = state
                    .in_flight
                    .front()
                    .is_some_and(|head| head.queued.elapsed() > TURN_TIMEOUT);
                if slow {
                    let state = &mut *state;
                    for request in state.in_flight.iter().skip(1) {
                        // Only clients still waiting: a drain task must
                        // read the answer of one that gave up already.
                        if request.abandoned {
                            continue;
                        }
                        if let Some(waker) = state.waiters.remove(&request.ticket) {
                            state.give_up.insert(request.ticket);
                            waker.wake();
                        }
                    }
                }
                let idle = state.in_flight.is_empty() && state.last_queued.elapsed() > WATCH_IDLE;
                state.watchdog_asleep = idle;
                idle
            };
            if asleep {
                self.watch.notified().await;
                tick.reset();
            }
        }
    }

    /// Gives up the place of `id`: a drain task reads its answer.
    fn abandon(self: &Arc<Self>, id: u64) {
        let mut state = self.lock();
        state.waiters.remove(&id);
        state.give_up.remove(&id);
        let Some(request) = state.in_flight.iter_mut().find(|r| r.ticket == id) else {
            return;
        };
        request.abandoned = true;
        if matches!(state.phase, Phase::Open) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(self.clone().drain(id));
            } else {
                close(&mut state);
            }
        }
    }

    /// Gives the connection back after reading the answer to `id`.
    /// `clean`: the answer was read to its end and left the connection
    /// idle; otherwise the pipe closes (its stream can no longer be
    /// matched to requests).
    fn finish(&self, id: u64, connection: ServerConnection, clean: bool) {
        let mut state = self.lock();
        let request = match state.in_flight.front() {
            Some(front) if front.ticket == id => {
                self.load.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                state.in_flight.pop_front()
            }
            _ => None,
        };
        let clean = clean && request.is_some() && connection.reusable_between_requests();
        if let Some(request) = request {
            for name in request.prepares {
                state.preparing.remove(&name);
                if clean && connection.prepared.contains(&name) {
                    state.prepared.insert(name);
                }
            }
        }
        state.served += 1;
        if !clean || !matches!(state.phase, Phase::Open) {
            drop(connection);
            close(&mut state);
            return;
        }
        state.connection = Some(connection);
        wake_front(&mut state);
    }

    /// Reads and drops the answer to an abandoned request.
    async fn drain(self: Arc<Self>, id: u64) {
        let Some(mut connection) = self.front(id).await else {
            return;
        };
        let answers = self
            .lock()
            .in_flight
            .front()
            .map_or(0, |request| request.answers);
        let mut clean = true;
        let mut seen = 0;
        while seen < answers {
            match connection.read().await {
                Ok((tags::backend::READY_FOR_QUERY, body)) => {
                    seen += 1;
                    connection.status = body.first().copied().unwrap_or(tags::status::FAILED);
                }
                Ok((tags::backend::PARSE_COMPLETE, _)) => {}
                // After an error it is not known what was prepared.
                Ok((tags::backend::ERROR_RESPONSE, _)) => clean = false,
                Ok(_) => {}
                Err(_) => {
                    clean = false;
                    break;
                }
            }
        }
        if clean {
            // Its Parse messages succeeded: the names are prepared.
            for name in self
                .lock()
                .in_flight
                .front()
                .map(|r| r.prepares.clone())
                .unwrap_or_default()
            {
                connection.prepared.insert(name);
            }
        }
        self.finish(id, connection, clean);
    }
}

impl Ticket {
    /// Waits until this request's answer is next and takes the connection
    /// to read it. None: it will not be answered here (the pipe closed, or
    /// the answers ahead took longer than [`TURN_TIMEOUT`]); nothing reached
    /// the client, so the caller runs it elsewhere.
    pub async fn turn(mut self) -> Option<Turn> {
        // Told to give up, the place is given up when `self` drops.
        let connection = self.pipe.front(self.id).await?;
        self.waiting = false;
        Some(Turn {
            pipe: self.pipe.clone(),
            id: self.id,
            connection: Some(connection),
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.waiting {
            self.pipe.abandon(self.id);
        }
    }
}

impl Turn {
    pub fn connection(&mut self) -> &mut ServerConnection {
        self.connection
            .as_mut()
            .expect("a turn holds the connection until it ends")
    }

    /// Hands the connection on (see [`Pipe::finish`] for `clean`).
    pub fn finish(mut self, clean: bool) {
        if let Some(connection) = self.connection.take() {
            self.pipe.finish(self.id, connection, clean);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            self.pipe.finish(self.id, connection, false);
        }
    }
}

/// Wakes the client whose answer is next.
fn wake_front(state: &mut State) {
    if let Some(front) = state.in_flight.front() {
        if let Some(waker) = state.waiters.remove(&front.ticket) {
            waker.wake();
        }
    }
}

/// Closes the pipe: waiting clients go elsewhere.
fn close(state: &mut State) {
    state.phase = Phase::Closed(Instant::now());
    state.connection = None;
    state.writer = None;
    state.pending.clear();
    for (_, waker) in state.waiters.drain() {
        waker.wake();
    }
}

/// Writes all of `data` on the pipe's write side, waiting for room when
/// the socket is full (registered for writability only then: a proxy's
/// small writes complete at once, and a standing registration would wake
/// the coordinator each time the server reads).
async fn write_all(mut writer: Inner, mut data: &[u8]) -> io::Result<Inner> {
    while !data.is_empty() {
        match writer.write(data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => data = &data[written..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let registered = socket::watch(writer, Interest::WRITABLE)?;
                registered.writable().await?.clear_ready();
                writer = registered.into_inner();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // What a TLS session took but the socket did not (else the requests
    // would wait for the next write, which waits for their answers).
    while !writer.flush()? {
        let registered = socket::watch(writer, Interest::WRITABLE)?;
        registered.writable().await?.clear_ready();
        writer = registered.into_inner();
    }
    Ok(writer)
}
