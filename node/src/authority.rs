//! The node authority: one per device set, an ordinary process (`memplug
//! node serve`) or embedded in a runtime ([`Authority::start`]). It listens
//! on a Unix socket, keeps the [`Books`], leases budget to members, presses
//! other members with tickets when a lease does not fit, and reclaims a
//! member's leases when its process dies.
//!
//! Threads: one accepts; one reads each connection; a lease that must press
//! others runs on a thread of its own (so the requester's reader keeps
//! reading); one watches members whose connection closed while their
//! process lived. The books are under one lock, never held across I/O
//! that waits on a peer.

use crate::books::{class_bit, Books, MemberId};
use crate::peer::{self, Liveness};
use crate::wire::{self, Declared, Frame, Msg, ALL_CLASSES};
use memplug_host::governor::AllocationClass;
use std::collections::HashMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How an authority is set up.
#[derive(Clone, Debug)]
pub struct AuthorityConfig {
    /// The socket's path; its file's permissions decide who may join.
    pub socket: PathBuf,
    /// Each device's name and capacity in bytes.
    pub devices: Vec<(String, u64)>,
    /// Budget moves in multiples of this.
    pub chunk: u64,
    /// The socket file's mode (default 0o600: the owner only).
    pub mode: u32,
    /// How long a member has to answer a ticket before it is skipped.
    pub ticket_timeout: Duration,
    /// The most bytes (all devices) a user id may lease.
    pub quotas: Vec<(u32, u64)>,
    /// The most bytes (all devices) the processes of a group id (their
    /// primary group, as the kernel gives it at connect) may lease
    /// together. A member under both a user and a group quota gets the
    /// smaller room.
    pub group_quotas: Vec<(u32, u64)>,
    /// How long after it starts the authority leases nothing, so that
    /// members of a previous authority rejoin and declare what they hold
    /// first (links retry every 20 ms by default): a lease asked meanwhile
    /// waits (within its own wait) instead of taking bytes a member not
    /// yet back still holds.
    pub rejoin_grace: Duration,
}

impl AuthorityConfig {
    pub fn new(socket: impl Into<PathBuf>, devices: Vec<(String, u64)>) -> Self {
        AuthorityConfig {
            socket: socket.into(),
            devices,
            chunk: 2 << 20,
            mode: 0o600,
            ticket_timeout: Duration::from_secs(2),
            quotas: Vec::new(),
            group_quotas: Vec::new(),
            rejoin_grace: Duration::from_millis(250),
        }
    }
}

struct Conn {
    writer: Mutex<UnixStream>,
    pid: i32,
    liveness: Liveness,
}

/// A ticket sent and not yet answered: to whom, for which device, and who
/// waits for the answer (none once the wait timed out: a late answer still
/// moves the books).
struct Pending {
    member: MemberId,
    device: String,
    waiter: Option<Sender<u64>>,
}

struct Shared {
    config: AuthorityConfig,
    books: Mutex<Books>,
    conns: Mutex<HashMap<MemberId, Arc<Conn>>>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    /// Members whose connection closed while their process lived: their
    /// leases stay counted until it exits (or joins again).
    watch: Mutex<Vec<(MemberId, Arc<Conn>)>>,
    stop: AtomicBool,
    tickets_sent: AtomicU64,
    tickets_timed_out: AtomicU64,
    /// When leasing may start (the end of the rejoin grace).
    open_at: Instant,
}

impl Shared {
    fn in_grace(&self) -> bool {
        Instant::now() < self.open_at
    }

    fn grace_refusal(&self) -> String {
        format!(
            "node: started less than {} ms ago, waiting for the members of a previous authority to rejoin",
            self.config.rejoin_grace.as_millis()
        )
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running authority. Dropping it stops it: the socket file is removed
/// and every connection closed; members keep what they hold and rejoin the
/// next authority on the same path.
pub struct Authority {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The listening socket (owned by the accept thread until it is
    /// joined): shut down to wake its `accept`.
    listener_fd: RawFd,
}

impl Authority {
    /// Binds the socket (a stale file from a dead authority is replaced;
    /// a live one refuses) and starts serving.
    pub fn start(config: AuthorityConfig) -> io::Result<Authority> {
        if config.chunk == 0 || config.devices.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a node needs a chunk > 0 and a device"));
        }
        if UnixStream::connect(&config.socket).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("an authority already serves {}", config.socket.display()),
            ));
        }
        let _ = std::fs::remove_file(&config.socket);
        let listener = UnixListener::bind(&config.socket)?;
        let listener_fd = listener.as_raw_fd();
        std::fs::set_permissions(&config.socket, std::fs::Permissions::from_mode(config.mode))?;
        let mut books = Books::new(config.chunk, &config.devices, &config.quotas);
        books.group_quotas = config.group_quotas.iter().copied().collect();
        let open_at = Instant::now() + config.rejoin_grace;
        let shared = Arc::new(Shared {
            open_at,
            config,
            books: Mutex::new(books),
            conns: Mutex::default(),
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            watch: Mutex::default(),
            stop: AtomicBool::new(false),
            tickets_sent: AtomicU64::new(0),
            tickets_timed_out: AtomicU64::new(0),
        });
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("memplug-node-accept".into())
            .spawn(move || accept_loop(s, listener))?;
        let s = shared.clone();
        let watch = thread::Builder::new().name("memplug-node-watch".into()).spawn(move || watch_loop(s))?;
        Ok(Authority { shared, threads: vec![accept, watch], listener_fd })
    }

    /// The socket it serves.
    pub fn socket(&self) -> &Path {
        &self.shared.config.socket
    }

    /// A copy of the books now.
    pub fn books(&self) -> Books {
        lock(&self.shared.books).clone()
    }

    /// A handle that reads the books from another thread while the
    /// authority runs (a sampler, a dashboard).
    pub fn view(&self) -> BooksView {
        BooksView(self.shared.clone())
    }

    /// The books as JSON (`memplug node status --json`).
    pub fn status_json(&self) -> String {
        status_json(&self.shared)
    }

    /// The books as Prometheus text (`memplug node status --prometheus`).
    pub fn status_prometheus(&self) -> String {
        status_prometheus(&self.shared)
    }
}

/// Reads an authority's books ([`Authority::view`]); once the authority
/// stopped, its last books.
#[derive(Clone)]
pub struct BooksView(Arc<Shared>);

impl BooksView {
    /// A copy of the books now.
    pub fn books(&self) -> Books {
        lock(&self.0.books).clone()
    }
}

impl Drop for Authority {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        // Wakes the accept loop: shutting the listener down makes a blocked
        // accept return on Linux, even when the socket file was removed
        // (so a connection to it cannot be made).
        // SAFETY: the accept thread owns the listener until it is joined
        // below, so the descriptor is still this socket's.
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        let _ = UnixStream::connect(&self.shared.config.socket);
        for c in lock(&self.shared.conns).values() {
            let _ = lock(&c.writer).shutdown(std::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.shared.config.socket);
    }
}

fn accept_loop(shared: Arc<Shared>, listener: UnixListener) {
    for stream in listener.incoming() {
        if shared.stop.load(SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let s = shared.clone();
        let _ = thread::Builder::new().name("memplug-node-conn".into()).spawn(move || serve(s, stream));
    }
}

fn send(conn: &Conn, m: &Msg) -> bool {
    wire::write_msg(&mut *lock(&conn.writer), m).is_ok()
}

/// One connection: `Hello` first, then any message; on close, the member's
/// leases are reclaimed if its process died, kept (watched) if it lives.
fn serve(shared: Arc<Shared>, stream: UnixStream) {
    let Ok((pid, uid, gid)) = peer::credentials(&stream) else { return };
    let Ok(writer) = stream.try_clone() else { return };
    let conn = Arc::new(Conn { writer: Mutex::new(writer), pid, liveness: Liveness::of(pid) });
    let mut reader = stream;
    let id = shared.next_id.fetch_add(1, SeqCst);
    let mut joined = false;
    loop {
        let frame = match wire::read_frame(&mut reader) {
            Ok(f) => f,
            Err(e) => {
                // Oversized or broken: the stream cannot be followed.
                send(&conn, &Msg::Error { reason: format!("closing: {e}") });
                break;
            }
        };
        let msg = match frame {
            Frame::Closed => break,
            Frame::Bad(why) => {
                send(&conn, &Msg::Error { reason: format!("refused: {why}") });
                continue;
            }
            Frame::Msg(m) => m,
        };
        if shared.stop.load(SeqCst) {
            break;
        }
        match (joined, msg) {
            (false, Msg::Hello { version, devices }) => {
                if version != wire::VERSION {
                    send(
                        &conn,
                        &Msg::Error {
                            reason: format!("protocol {version}; this node speaks {}", wire::VERSION),
                        },
                    );
                    break;
                }
                match join(&shared, id, &conn, (uid, gid), &devices) {
                    Ok(welcome) => {
                        joined = true;
                        send(&conn, &welcome);
                    }
                    Err(why) => {
                        send(&conn, &Msg::Error { reason: why });
                        break;
                    }
                }
            }
            (_, Msg::Status { prometheus }) => {
                let text = if prometheus { status_prometheus(&shared) } else { status_json(&shared) };
                send(&conn, &Msg::StatusReply { text });
            }
            (true, Msg::Lease { req, device, min, want, wait_ms, class, priority }) => {
                let ask = Ask { req, min, want, wait_ms, class, priority };
                lease(&shared, id, &conn, device, ask);
            }
            (true, Msg::Return { device, bytes }) => {
                if let Err(why) = lock(&shared.books).give_back(id, &device, bytes) {
                    send(&conn, &Msg::Error { reason: format!("Return refused: {why}") });
                }
            }
            (true, Msg::Answer { ticket, released }) => {
                if let Err(why) = answer(&shared, id, ticket, released) {
                    send(&conn, &Msg::Error { reason: format!("Answer refused: {why}") });
                }
            }
            (joined, m) => {
                let why = if joined { "a message only the authority sends" } else { "Hello must come first" };
                send(&conn, &Msg::Error { reason: format!("{} refused: {why}", m.name()) });
            }
        }
    }
    lock(&shared.conns).remove(&id);
    // Tickets to it will not be answered on this connection.
    for p in lock(&shared.pending).values_mut().filter(|p| p.member == id) {
        p.waiter = None;
    }
    let mut books = lock(&shared.books);
    if conn.liveness.exited(pid) {
        books.reclaim(id);
    } else if let Some(m) = books.members.get_mut(&id) {
        m.connected = false;
        drop(books);
        lock(&shared.watch).push((id, conn));
    }
}

fn join(
    shared: &Shared,
    id: MemberId,
    conn: &Arc<Conn>,
    (uid, gid): (u32, u32),
    devices: &[Declared],
) -> Result<Msg, String> {
    let mut books = lock(&shared.books);
    // The same process joining again (its connection closed while it
    // lived): what it declares now replaces what it held, counted once.
    let again: Vec<MemberId> =
        books.members.iter().filter(|(_, m)| m.pid == conn.pid && !m.connected).map(|(i, _)| *i).collect();
    let old: Vec<_> = again.iter().filter_map(|i| books.reclaim(*i).map(|m| (*i, m))).collect();
    if let Err(why) = books.join(id, conn.pid, (uid, gid), devices) {
        for (i, m) in old {
            books.members.insert(i, m.clone());
            for (d, b) in &m.leased {
                if let Some(dev) = books.devices.get_mut(d) {
                    dev.leased += b;
                }
            }
        }
        return Err(why);
    }
    if let Some(m) = books.members.get_mut(&id) {
        m.pidfd = !conn.liveness.is_fallback();
    }
    lock(&shared.watch).retain(|(i, _)| !again.contains(i));
    lock(&shared.conns).insert(id, conn.clone());
    let devices = books.devices.iter().map(|(n, d)| (n.clone(), d.capacity)).collect();
    Ok(Msg::Welcome { chunk: books.chunk, devices })
}

/// One lease request's terms, as the member sent them.
#[derive(Clone, Copy)]
struct Ask {
    req: u64,
    min: u64,
    want: u64,
    wait_ms: u64,
    class: u8,
    priority: u32,
}

fn lease(shared: &Arc<Shared>, id: MemberId, conn: &Arc<Conn>, device: String, ask: Ask) {
    let Ask { req, min, want, wait_ms, .. } = ask;
    let first = {
        let mut books = lock(&shared.books);
        match books.malformed_lease(id, &device, min, want) {
            // Refused at once, whatever the wait: no room could make it fit.
            Err(why) => {
                if let Some(m) = books.members.get_mut(&id) {
                    m.leases_refused += 1;
                }
                drop(books);
                send(conn, &Msg::Refused { req, reason: format!("node: {why}") });
                return;
            }
            Ok(()) if shared.in_grace() => Err(shared.grace_refusal()),
            Ok(()) => books.lease(id, &device, min, want),
        }
    };
    match first {
        Ok(bytes) => {
            send(conn, &Msg::Granted { req, bytes });
        }
        Err(_) if wait_ms > 0 => {
            // Pressing others takes their answers: not on the reader.
            let (s, c) = (shared.clone(), conn.clone());
            let _ = thread::Builder::new()
                .name("memplug-node-press".into())
                .spawn(move || press(&s, id, &c, &device, ask));
        }
        Err(why) => {
            if let Some(m) = lock(&shared.books).members.get_mut(&id) {
                m.leases_refused += 1;
            }
            send(conn, &Msg::Refused { req, reason: format!("node: {why}") });
        }
    }
}

/// Sends tickets to other members declared at equal or lower priority than
/// the request presses with (`Books::victims`), one at a time (lowest
/// priority first, and within a priority those declared holding memory of
/// the request's class first), until
/// the lease fits or nobody is left or the wait ends; then grants or
/// refuses naming who answered what (and who was not asked).
fn press(shared: &Shared, id: MemberId, conn: &Conn, device: &str, ask: Ask) {
    let Ask { req, min, want, wait_ms, class, .. } = ask;
    let end = Instant::now() + Duration::from_millis(wait_ms);
    // Within the rejoin grace: wait for it to end (as far as the request
    // may wait), then take what is free or press as usual.
    let now = Instant::now();
    if now < shared.open_at {
        thread::sleep(shared.open_at.min(end) - now);
        if shared.in_grace() {
            send(conn, &Msg::Refused { req, reason: shared.grace_refusal() });
            return;
        }
        if let Ok(bytes) = lock(&shared.books).lease(id, device, min, want) {
            send(conn, &Msg::Granted { req, bytes });
            return;
        }
    }
    let (victims, priority, above) = {
        let books = lock(&shared.books);
        let priority = books.pressing_priority(id, device, ask.priority);
        let victims = books.victims(id, device, priority, class_bit(class));
        // Members holding some that the request may not press: declared
        // above its priority.
        let above = books.victims(id, device, u32::MAX, ALL_CLASSES).len() - victims.len();
        (victims, priority, above)
    };
    let mut report = Vec::new();
    for v in victims {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let Some(vconn) = lock(&shared.conns).get(&v).cloned() else { continue };
        let missing = min.saturating_sub(lock(&shared.books).free(device)).max(1);
        let ticket = shared.next_id.fetch_add(1, SeqCst);
        let (tx, rx) = mpsc::channel();
        lock(&shared.pending)
            .insert(ticket, Pending { member: v, device: device.to_string(), waiter: Some(tx) });
        if let Some(m) = lock(&shared.books).members.get_mut(&v) {
            m.tickets_received += 1;
        }
        shared.tickets_sent.fetch_add(1, SeqCst);
        let wait_ms = (end - now).as_millis() as u64;
        let t = Msg::Ticket { ticket, device: device.to_string(), bytes: missing, class, priority, wait_ms };
        if !send(&vconn, &t) {
            lock(&shared.pending).remove(&ticket);
            continue;
        }
        let patience = shared.config.ticket_timeout.min(end - now);
        match rx.recv_timeout(patience) {
            Ok(released) => report.push(format!("pid {} released {released} B", vconn.pid)),
            Err(_) => {
                if let Some(p) = lock(&shared.pending).get_mut(&ticket) {
                    p.waiter = None; // a late answer still moves the books
                }
                shared.tickets_timed_out.fetch_add(1, SeqCst);
                if let Some(m) = lock(&shared.books).members.get_mut(&v) {
                    m.tickets_skipped += 1;
                }
                report.push(format!(
                    "pid {} did not answer in {} ms (skipped)",
                    vconn.pid,
                    patience.as_millis()
                ));
            }
        }
        if let Ok(bytes) = lock(&shared.books).lease(id, device, min, want) {
            send(conn, &Msg::Granted { req, bytes });
            return;
        }
    }
    let mut books = lock(&shared.books);
    match books.lease(id, device, min, want) {
        Ok(bytes) => {
            send(conn, &Msg::Granted { req, bytes });
        }
        Err(why) => {
            if let Some(m) = books.members.get_mut(&id) {
                m.leases_refused += 1;
            }
            if above > 0 {
                report.push(format!("{above} member(s) of priority above {priority} not asked"));
            }
            let asked =
                if report.is_empty() { "nobody held any to ask".to_string() } else { report.join("; ") };
            send(conn, &Msg::Refused { req, reason: format!("node: {why}; {asked}") });
        }
    }
}

fn answer(shared: &Shared, id: MemberId, ticket: u64, released: u64) -> Result<(), String> {
    let mut pending = lock(&shared.pending);
    match pending.get(&ticket) {
        None => return Err(format!("no ticket {ticket} is open (answered already, or never sent)")),
        Some(p) if p.member != id => return Err(format!("ticket {ticket} was sent to another member")),
        Some(_) => {}
    }
    let p = pending.remove(&ticket).expect("looked");
    drop(pending);
    let mut books = lock(&shared.books);
    books.give_back(id, &p.device, released)?;
    if let Some(m) = books.members.get_mut(&id) {
        m.tickets_answered += 1;
        m.bytes_released += released;
    }
    drop(books);
    if let Some(w) = p.waiter {
        let _ = w.send(released);
    }
    Ok(())
}

/// Reclaims members whose connection closed once their process exits.
fn watch_loop(shared: Arc<Shared>) {
    while !shared.stop.load(SeqCst) {
        thread::sleep(Duration::from_millis(20));
        // The watch lock is never held with the books' (join takes the
        // books', then the watch's).
        let mut gone = Vec::new();
        lock(&shared.watch).retain(|(id, conn)| {
            let exited = conn.liveness.exited(conn.pid);
            if exited {
                gone.push(*id);
            }
            !exited
        });
        let mut books = lock(&shared.books);
        for id in gone {
            books.reclaim(id);
        }
    }
}

/// Each device's declared classes by name (`["kv", "weights"]`).
fn class_names(classes: &std::collections::BTreeMap<String, u8>) -> serde_json::Value {
    classes
        .iter()
        .map(|(d, mask)| {
            let names: Vec<&str> = AllocationClass::ALL
                .iter()
                .filter(|c| mask & (1 << c.index()) != 0)
                .map(|c| c.name())
                .collect();
            (d.clone(), serde_json::json!(names))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn status_json(shared: &Shared) -> String {
    let books = lock(&shared.books);
    let devices: serde_json::Map<String, serde_json::Value> = books
        .devices
        .iter()
        .map(|(n, d)| {
            (
                n.clone(),
                serde_json::json!({"capacity": d.capacity, "leased": d.leased, "free": books.free(n)}),
            )
        })
        .collect();
    let members: Vec<serde_json::Value> = books
        .members
        .iter()
        .map(|(id, m)| {
            serde_json::json!({
                "id": id, "pid": m.pid, "uid": m.uid, "connected": m.connected, "pidfd": m.pidfd,
                "leased": m.leased, "priority": m.priority, "classes": class_names(&m.classes),
                "tickets_received": m.tickets_received, "tickets_answered": m.tickets_answered,
                "tickets_skipped": m.tickets_skipped, "bytes_released": m.bytes_released,
                "leases_granted": m.leases_granted, "leases_refused": m.leases_refused,
            })
        })
        .collect();
    serde_json::json!({
        "chunk": books.chunk,
        "devices": devices,
        "members": members,
        "tickets_sent": shared.tickets_sent.load(SeqCst),
        "tickets_timed_out": shared.tickets_timed_out.load(SeqCst),
        "books_exact": books.check().is_ok(),
    })
    .to_string()
}

fn status_prometheus(shared: &Shared) -> String {
    let books = lock(&shared.books);
    let mut out = String::new();
    out.push_str("# TYPE memplug_node_capacity_bytes gauge\n# TYPE memplug_node_leased_bytes gauge\n");
    for (n, d) in &books.devices {
        out.push_str(&format!("memplug_node_capacity_bytes{{device=\"{n}\"}} {}\n", d.capacity));
        out.push_str(&format!("memplug_node_leased_bytes{{device=\"{n}\"}} {}\n", d.leased));
    }
    out.push_str("# TYPE memplug_node_member_leased_bytes gauge\n");
    for m in books.members.values() {
        for (d, b) in &m.leased {
            out.push_str(&format!(
                "memplug_node_member_leased_bytes{{pid=\"{}\",device=\"{d}\"}} {b}\n",
                m.pid
            ));
        }
    }
    out.push_str("# TYPE memplug_node_member_class gauge\n");
    for m in books.members.values() {
        for (d, mask) in &m.classes {
            for c in AllocationClass::ALL.iter().filter(|c| mask & (1 << c.index()) != 0) {
                out.push_str(&format!(
                    "memplug_node_member_class{{pid=\"{}\",device=\"{d}\",class=\"{c}\"}} 1\n",
                    m.pid
                ));
            }
        }
    }
    out.push_str(&format!(
        "# TYPE memplug_node_tickets_total counter\nmemplug_node_tickets_total {}\nmemplug_node_tickets_timed_out_total {}\n",
        shared.tickets_sent.load(SeqCst),
        shared.tickets_timed_out.load(SeqCst)
    ));
    out
}
