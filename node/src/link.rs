//! A process's side: [`NodeLink`] joins pools to an authority. Each pool's
//! capacity becomes what the authority leased to this process for that
//! device; a request the capacity cannot hold asks the authority for more
//! (`BudgetSource`), a ticket from the authority lowers the capacity (the
//! pool's holders asked first, exactly as for an in-process ticket), and
//! idle chunks go back on a timer. If the authority goes away, the pools
//! keep what they hold and the link joins the next authority on the same
//! socket, declaring it.

use crate::gate::{Capacity, Gates, Stale};
use crate::wire::{self, Declared, Frame, Msg};
use memplug_host::governor::{AllocationClass, BudgetSource, Pool, Priority};
use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A pool joined to the node for one of its devices.
#[derive(Clone)]
pub struct LinkDevice {
    /// The device's name at the authority (`cpu0`, `cuda0`).
    pub device: String,
    /// The root pool whose capacity the authority's leases make up.
    pub pool: Arc<Pool>,
    /// Its holders' priority against other processes' (lower gives first).
    pub priority: u32,
    /// The classes of memory its pool holds ([`wire::ClassMask`]: bit
    /// `AllocationClass as u8`, e.g. `1 << AllocationClass::Kv as u8`; 0
    /// or [`wire::ALL_CLASSES`]: any). Among members of one priority, the
    /// authority presses those that declared a request's class first, then
    /// the others (classes order, they never exclude).
    pub classes: wire::ClassMask,
}

/// How a link behaves.
#[derive(Clone, Debug)]
pub struct LinkOptions {
    /// Idle budget kept per device before chunks go back (in chunks).
    pub keep_idle_chunks: u64,
    /// How often idle chunks are given back and a lost authority retried.
    pub tick: Duration,
    /// How long a lease may press other processes when the request itself
    /// may not wait (a request with a deadline presses until it).
    pub press_without_deadline: Duration,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            keep_idle_chunks: 1,
            tick: Duration::from_millis(20),
            press_without_deadline: Duration::from_millis(500),
        }
    }
}

struct Dev {
    spec: LinkDevice,
}

struct Shared {
    socket: PathBuf,
    devs: Vec<Dev>,
    /// Every change of a pool's capacity goes through these (`gate.rs`):
    /// none is lost, and a new authority counts each byte once.
    gates: Gates,
    options: LinkOptions,
    writer: Mutex<Option<UnixStream>>,
    chunk: AtomicU64,
    next_req: AtomicU64,
    replies: Mutex<HashMap<u64, Sender<Result<u64, String>>>>,
    status: Mutex<Option<Sender<String>>>,
    stop: AtomicBool,
    /// The last refusal or error the authority sent, for reports.
    last_error: Mutex<Option<String>>,
    reader: Mutex<Option<JoinHandle<()>>>,
    counters: Counters,
}

/// What a link did, counted where it happens (relaxed: statistics only).
#[derive(Default)]
struct Counters {
    leases_asked: AtomicU64,
    leases_granted: AtomicU64,
    leases_refused: AtomicU64,
    bytes_leased: AtomicU64,
    bytes_returned: AtomicU64,
    tickets_answered: AtomicU64,
    bytes_released: AtomicU64,
    joins: AtomicU64,
}

/// A link's statistics ([`NodeLink::stats`]): this process's side of the
/// authority's books.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Whether an authority is connected now.
    pub connected: bool,
    /// The chunk size the authority moves budget in (0 before a Welcome).
    pub chunk: u64,
    /// The bytes the joined pools hold now (the sum of their capacities:
    /// what the authority counts as leased to this process).
    pub held: u64,
    /// The bytes of it in use.
    pub used: u64,
    /// Lease requests sent, granted, and refused or unanswered.
    pub leases_asked: u64,
    pub leases_granted: u64,
    pub leases_refused: u64,
    /// Bytes obtained by leases; bytes given back idle.
    pub bytes_leased: u64,
    pub bytes_returned: u64,
    /// Tickets from the authority answered, and the bytes they released.
    pub tickets_answered: u64,
    pub bytes_released: u64,
    /// Times the link joined an authority (the first join included: more
    /// than one means an authority restarted and was rejoined).
    pub joins: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A process joined to a node authority. Dropping it gives idle chunks
/// back and leaves; what the pools still hold stays counted by the
/// authority until this process exits.
pub struct NodeLink {
    shared: Arc<Shared>,
    ticker: Option<JoinHandle<()>>,
}

impl NodeLink {
    /// Joins `devices`' pools to the authority at `socket`. Each pool's
    /// capacity is first lowered to what it uses (declared as held); from
    /// then on it is what the authority leases. Fails if the authority is
    /// not there, refuses a device, or a pool already has a budget source.
    pub fn join(
        socket: impl Into<PathBuf>,
        devices: Vec<LinkDevice>,
        options: LinkOptions,
    ) -> io::Result<NodeLink> {
        let devs: Vec<Dev> = devices.into_iter().map(|spec| Dev { spec }).collect();
        let shared = Arc::new(Shared {
            gates: Gates::new(devs.len()),
            socket: socket.into(),
            devs,
            options,
            writer: Mutex::new(None),
            chunk: AtomicU64::new(0),
            next_req: AtomicU64::new(1),
            replies: Mutex::default(),
            status: Mutex::default(),
            stop: AtomicBool::new(false),
            last_error: Mutex::new(None),
            reader: Mutex::new(None),
            counters: Counters::default(),
        });
        // Refused before anything changes: a pool joins once for its life
        // (its source cannot be replaced).
        if let Some(d) = shared.devs.iter().find(|d| d.spec.pool.has_budget_source()) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("pool {} already takes budget from a source", d.spec.pool.name()),
            ));
        }
        let before: Vec<u64> = shared.devs.iter().map(|d| d.spec.pool.capacity()).collect();
        for d in &shared.devs {
            // Idle budget is not the node's to count: keep only what is
            // used. (Nothing else changes these pools' capacities yet: no
            // source is set and no tick runs.)
            let _ = d.spec.pool.set_capacity(d.spec.pool.used());
        }
        if let Err(e) = connect(&shared) {
            // A refused join leaves the pools as they were.
            for (d, cap) in shared.devs.iter().zip(before) {
                let _ = d.spec.pool.set_capacity(cap);
            }
            return Err(e);
        }
        for (i, d) in shared.devs.iter().enumerate() {
            let source = Arc::new(Source { shared: Arc::downgrade(&shared), dev: i });
            // Checked above; a pool joined by another thread meanwhile
            // keeps its first source, and this link's leases still count.
            let _ = d.spec.pool.set_budget_source(source);
        }
        let s = Arc::downgrade(&shared);
        let ticker = thread::Builder::new().name("memplug-node-link".into()).spawn(move || tick_loop(s))?;
        Ok(NodeLink { shared, ticker: Some(ticker) })
    }

    /// Whether the link is connected to an authority now.
    pub fn connected(&self) -> bool {
        lock(&self.shared.writer).is_some()
    }

    /// The chunk size the authority moves budget in.
    pub fn chunk(&self) -> u64 {
        self.shared.chunk.load(SeqCst)
    }

    /// The last refusal or error the authority sent.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared.last_error).clone()
    }

    /// This process's side of the books now.
    pub fn stats(&self) -> LinkStats {
        let s = &self.shared;
        let c = &s.counters;
        let r = |a: &AtomicU64| a.load(Relaxed);
        LinkStats {
            connected: self.connected(),
            chunk: self.chunk(),
            held: s.devs.iter().map(|d| d.spec.pool.capacity()).sum(),
            used: s.devs.iter().map(|d| d.spec.pool.used()).sum(),
            leases_asked: r(&c.leases_asked),
            leases_granted: r(&c.leases_granted),
            leases_refused: r(&c.leases_refused),
            bytes_leased: r(&c.bytes_leased),
            bytes_returned: r(&c.bytes_returned),
            tickets_answered: r(&c.tickets_answered),
            bytes_released: r(&c.bytes_released),
            joins: r(&c.joins),
        }
    }

    /// The authority's books (JSON, or Prometheus text), within `timeout`.
    pub fn status(&self, prometheus: bool, timeout: Duration) -> io::Result<String> {
        let (tx, rx) = mpsc::channel();
        *lock(&self.shared.status) = Some(tx);
        send(&self.shared, &Msg::Status { prometheus })?;
        rx.recv_timeout(timeout)
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no status from the authority"))
    }
}

impl Drop for NodeLink {
    fn drop(&mut self) {
        give_back_idle(&self.shared, 0);
        self.shared.stop.store(true, SeqCst);
        if let Some(w) = lock(&self.shared.writer).take() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        if let Some(r) = lock(&self.shared.reader).take() {
            let _ = r.join();
        }
    }
}

fn send(shared: &Shared, m: &Msg) -> io::Result<()> {
    send_in_generation(shared, m).map(drop)
}

/// Sends `m` and says in which generation (`gate.rs`): read under the
/// writer's lock, so it is the generation of the connection written to (a
/// join moves the generation on before it installs its connection).
fn send_in_generation(shared: &Shared, m: &Msg) -> io::Result<u64> {
    let mut w = lock(&shared.writer);
    let generation = shared.gates.generation();
    match w.as_mut() {
        Some(w) => wire::write_msg(w, m).map(|()| generation),
        None => Err(io::Error::new(io::ErrorKind::NotConnected, "no authority")),
    }
}

/// Connects and joins, declaring what each pool holds (its capacity, read
/// by the gates as the generation moves on: a grant or ticket of the
/// previous authority is either in the declaration or not applied at all).
fn connect(shared: &Arc<Shared>) -> io::Result<()> {
    let mut stream = UnixStream::connect(&shared.socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let pools: Vec<&dyn Capacity> = shared.devs.iter().map(|d| &*d.spec.pool as &dyn Capacity).collect();
    let holding = shared.gates.join(&pools);
    let devices = shared
        .devs
        .iter()
        .zip(holding)
        .map(|(d, holding)| Declared {
            device: d.spec.device.clone(),
            priority: d.spec.priority,
            classes: d.spec.classes,
            holding,
        })
        .collect();
    wire::write_msg(&mut stream, &Msg::Hello { version: wire::VERSION, devices })?;
    match wire::read_frame(&mut stream)? {
        Frame::Msg(Msg::Welcome { chunk, .. }) => shared.chunk.store(chunk, SeqCst),
        Frame::Msg(Msg::Error { reason }) => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the authority refused: {reason}"),
            ))
        }
        other => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("no Welcome: {other:?}"))),
    }
    stream.set_read_timeout(None)?;
    let reader = stream.try_clone()?;
    {
        // A link being dropped sets `stop` before it takes the writer: a
        // connection made meanwhile (by the ticker) must not be installed
        // after that take, or its reader would block the drop's join for
        // ever. Checked under the writer's lock, so either the drop takes
        // (and shuts) this connection or this sees `stop`.
        let mut w = lock(&shared.writer);
        if shared.stop.load(SeqCst) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Err(io::Error::new(io::ErrorKind::NotConnected, "the link is closing"));
        }
        *w = Some(stream);
    }
    shared.counters.joins.fetch_add(1, Relaxed);
    let s = Arc::downgrade(shared);
    let handle =
        thread::Builder::new().name("memplug-node-read".into()).spawn(move || read_loop(s, reader))?;
    if let Some(old) = lock(&shared.reader).replace(handle) {
        let _ = old.join();
    }
    Ok(())
}

fn read_loop(shared: Weak<Shared>, mut stream: UnixStream) {
    loop {
        let frame = wire::read_frame(&mut stream);
        let Some(s) = shared.upgrade() else { return };
        match frame {
            Ok(Frame::Msg(Msg::Granted { req, bytes })) => {
                if let Some(tx) = lock(&s.replies).remove(&req) {
                    let _ = tx.send(Ok(bytes));
                }
            }
            Ok(Frame::Msg(Msg::Refused { req, reason })) => {
                *lock(&s.last_error) = Some(reason.clone());
                if let Some(tx) = lock(&s.replies).remove(&req) {
                    let _ = tx.send(Err(reason));
                }
            }
            Ok(Frame::Msg(Msg::Ticket { ticket, device, bytes, class, priority, wait_ms })) => {
                // Holders may take a while: not on the reader.
                let s2 = s.clone();
                let on_behalf = OnBehalf {
                    generation: s.gates.generation(),
                    class: class_of(class),
                    priority: Priority(priority),
                    deadline: Instant::now() + Duration::from_millis(wait_ms),
                };
                let _ = thread::Builder::new()
                    .name("memplug-node-ticket".into())
                    .spawn(move || answer_ticket(&s2, ticket, &device, bytes, on_behalf));
            }
            Ok(Frame::Msg(Msg::StatusReply { text })) => {
                if let Some(tx) = lock(&s.status).take() {
                    let _ = tx.send(text);
                }
            }
            Ok(Frame::Msg(Msg::Error { reason })) => *lock(&s.last_error) = Some(reason),
            Ok(Frame::Msg(_)) | Ok(Frame::Bad(_)) => {}
            Ok(Frame::Closed) | Err(_) => {
                // The authority is gone: pools keep what they hold; the
                // ticker joins the next one.
                lock(&s.writer).take();
                for (_, tx) in lock(&s.replies).drain() {
                    let _ = tx.send(Err("the node authority went away".into()));
                }
                return;
            }
        }
    }
}

/// The request of another process a ticket is sent for.
#[derive(Clone, Copy)]
struct OnBehalf {
    /// The generation (`gate.rs`) the ticket came in.
    generation: u64,
    class: AllocationClass,
    priority: Priority,
    deadline: Instant,
}

/// A class from the wire; an unknown number is read as the most
/// conservative class, `Other`.
fn class_of(n: u8) -> AllocationClass {
    AllocationClass::ALL.get(n as usize).copied().unwrap_or(AllocationClass::Other)
}

/// Asks the device's holders of equal or lower priority than the
/// requester (with its class and deadline) to bring its use down by
/// `bytes`, then lowers the pool's capacity by what they freed and answers
/// with it. A ticket of an authority that is gone changes nothing and is
/// not answered: what the holders freed is idle and goes back to the new
/// authority with the idle budget.
fn answer_ticket(s: &Shared, ticket: u64, device: &str, bytes: u64, on: OnBehalf) {
    let released = match s.devs.iter().position(|d| d.spec.device == device) {
        None => Some(0),
        Some(i) => {
            let pool = &s.devs[i].spec.pool;
            // The holders first, outside the gate's lock: they may take
            // long, and a rejoin must not wait for them.
            let relieve = || {
                pool.relieve_for(
                    pool.capacity().saturating_sub(bytes),
                    on.class,
                    on.priority,
                    Some(on.deadline),
                );
            };
            s.gates.ticket(i, &**pool, on.generation, bytes, relieve)
        }
    };
    let Some(released) = released else { return };
    s.counters.tickets_answered.fetch_add(1, Relaxed);
    s.counters.bytes_released.fetch_add(released, Relaxed);
    let _ = send(s, &Msg::Answer { ticket, released });
}

/// Gives back idle budget above `keep` chunks on every device whose
/// capacity no other thread is changing (the tick that calls this also
/// rejoins a restarted authority and must not wait for a holder).
fn give_back_idle(s: &Shared, keep_chunks: u64) {
    let chunk = s.chunk.load(SeqCst).max(1);
    for (i, d) in s.devs.iter().enumerate() {
        if let Some(r) = s.gates.idle(i, &*d.spec.pool, keep_chunks, chunk).filter(|r| *r > 0) {
            s.counters.bytes_returned.fetch_add(r, Relaxed);
            // Without an authority the send fails: the next one learns the
            // lower holding when the link joins it.
            let _ = send(s, &Msg::Return { device: d.spec.device.clone(), bytes: r });
        }
    }
}

fn tick_loop(shared: Weak<Shared>) {
    loop {
        let Some(s) = shared.upgrade() else { return };
        if s.stop.load(SeqCst) {
            return;
        }
        let tick = s.options.tick;
        if lock(&s.writer).is_some() {
            give_back_idle(&s, s.options.keep_idle_chunks);
        } else {
            let _ = connect(&s);
        }
        drop(s);
        thread::sleep(tick);
    }
}

/// A pool's source: leases from the authority.
struct Source {
    shared: Weak<Shared>,
    dev: usize,
}

impl BudgetSource for Source {
    fn acquire(&self, pool: &Pool, missing: u64, deadline: Option<Instant>) -> u64 {
        self.acquire_for(pool, missing, AllocationClass::Other, Priority::HIGHEST, deadline)
    }

    fn acquire_for(
        &self,
        pool: &Pool,
        missing: u64,
        class: AllocationClass,
        priority: Priority,
        deadline: Option<Instant>,
    ) -> u64 {
        let Some(s) = self.shared.upgrade() else { return 0 };
        if s.stop.load(SeqCst) {
            return 0;
        }
        let d = &s.devs[self.dev];
        let chunk = s.chunk.load(SeqCst).max(1);
        let want = missing.div_ceil(chunk).saturating_mul(chunk);
        let wait = match deadline {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => s.options.press_without_deadline,
        };
        let req = s.next_req.fetch_add(1, SeqCst);
        let (tx, rx) = mpsc::channel();
        lock(&s.replies).insert(req, tx);
        let lease = Msg::Lease {
            req,
            device: d.spec.device.clone(),
            min: missing,
            want,
            wait_ms: wait.as_millis() as u64,
            class: class as u8,
            // The authority caps it at the priority this process declared.
            priority: priority.0,
        };
        s.counters.leases_asked.fetch_add(1, Relaxed);
        let Ok(generation) = send_in_generation(&s, &lease) else {
            lock(&s.replies).remove(&req);
            s.counters.leases_refused.fetch_add(1, Relaxed);
            return 0;
        };
        // The authority answers within the wait and a ticket's timeout;
        // a lost authority fails the request at once (read_loop).
        let answer = rx.recv_timeout(wait + Duration::from_secs(5));
        lock(&s.replies).remove(&req);
        match answer {
            Ok(Ok(bytes)) => match s.gates.grant(self.dev, pool, generation, bytes) {
                Ok(()) => {
                    s.counters.leases_granted.fetch_add(1, Relaxed);
                    s.counters.bytes_leased.fetch_add(bytes, Relaxed);
                    bytes
                }
                // Granted by an authority that is gone: the one joined
                // since never counted these bytes.
                Err(Stale::Generation) => {
                    s.counters.leases_refused.fetch_add(1, Relaxed);
                    0
                }
                Err(Stale::Refused) => {
                    s.counters.leases_refused.fetch_add(1, Relaxed);
                    let _ = send(&s, &Msg::Return { device: d.spec.device.clone(), bytes });
                    0
                }
            },
            Ok(Err(_)) | Err(_) => {
                s.counters.leases_refused.fetch_add(1, Relaxed);
                0
            }
        }
    }
}
