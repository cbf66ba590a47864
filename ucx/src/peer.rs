//! A peer: the other process, reached by a control stream (worker
//! addresses, offers, releases, revokes: `wire.rs`) and a UCP endpoint
//! (the bytes).
//!
//! Who may deregister when: an owner that offered a range cannot
//! deregister it while the peer holds its key (`Registration::deregister`
//! says `Busy`); the peer gives it back with [`Peer::release`], or the
//! owner asks with [`Peer::revoke`], which waits (with a deadline) for the
//! peer to finish its transfers on the range and acknowledge. A peer that
//! is lost (its stream closed, its endpoint failed) gives back everything
//! it held: its process cannot issue a transfer any more, and its endpoint
//! is force-closed first so nothing of it is still in flight here. So a
//! remote key is never used after its range was deregistered: the holder
//! learns of the revoke before the owner unmaps, and refuses the range
//! afterwards (`Revoked`).

use crate::context::Ucx;
use crate::error::UcxError;
use crate::registration::{Access, RegInner, Registration};
use crate::transfer::{Direction, Endpoint, ErrorHandling, RemoteKey, Transfer};
use crate::wire::{self, Msg, Read1, Reader};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A reliable byte stream to the peer: a Unix socket on one machine, TCP
/// between nodes.
pub trait ControlStream: Read + Write + Send {
    /// Switches the stream to non-blocking (the peer polls it between
    /// progress passes of the worker).
    fn set_nonblocking_mode(&self) -> std::io::Result<()>;
}

impl ControlStream for std::os::unix::net::UnixStream {
    fn set_nonblocking_mode(&self) -> std::io::Result<()> {
        self.set_nonblocking(true)
    }
}

impl ControlStream for std::net::TcpStream {
    fn set_nonblocking_mode(&self) -> std::io::Result<()> {
        self.set_nonblocking(true)
    }
}

/// A stream whose kind is known only at run time (the C API takes a
/// descriptor of either kind).
impl ControlStream for Box<dyn ControlStream> {
    fn set_nonblocking_mode(&self) -> std::io::Result<()> {
        (**self).set_nonblocking_mode()
    }
}

/// A range the peer offered: where it is in the peer's address space, how
/// long, whether it may be written, and the tag the peer gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRange {
    /// The offer's id on this connection.
    pub id: u64,
    /// The peer's address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Whether [`Peer::push_from_region`] may write it.
    pub writable: bool,
    /// The owner's tag (what the range is: a block, a prefix...).
    pub tag: u64,
}

struct Imported {
    range: RemoteRange,
    key: Arc<RemoteKey>,
    /// Transfers issued on the range, kept until complete (a revoke or
    /// release waits for them).
    transfers: Vec<Transfer>,
    /// Being given back: no new transfer; the owner is told (`Release`
    /// or `RevokeAck`) only once every transfer on it has completed, so it
    /// never deregisters memory a transfer of this side may still reach.
    closing: Option<Closing>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Closing {
    Released,
    Revoked,
}

/// The other process.
pub struct Peer {
    ucx: Ucx,
    stream: Box<dyn ControlStream>,
    reader: Reader,
    ep: Arc<Endpoint>,
    next_id: u64,
    /// Ranges offered to the peer, by id.
    exported: HashMap<u64, Arc<RegInner>>,
    /// Ranges the peer offered, by id.
    imported: HashMap<u64, Imported>,
    /// Offers received and not yet taken by `next_offer`.
    offers: VecDeque<RemoteRange>,
    /// Ids given back (released here or revoked there), and how.
    gone: HashMap<u64, &'static str>,
    /// Why the peer is lost, once it is.
    lost: Option<String>,
    /// Passes of `turn`, and when the last one did something.
    turns: u64,
    active: Instant,
}

impl Peer {
    /// Exchanges worker addresses over `stream` (both sides call this) and
    /// makes the endpoint. Waits up to `timeout` for the peer's address.
    pub fn connect(
        ucx: &Ucx,
        stream: impl ControlStream + 'static,
        timeout: Duration,
    ) -> Result<Peer, UcxError> {
        Peer::connect_with(ucx, stream, timeout, ErrorHandling::Peer)
    }

    /// [`connect`](Self::connect) with a choice of peer-failure handling
    /// (both sides must choose the same; see [`ErrorHandling`]).
    pub fn connect_with(
        ucx: &Ucx,
        stream: impl ControlStream + 'static,
        timeout: Duration,
        mode: ErrorHandling,
    ) -> Result<Peer, UcxError> {
        stream.set_nonblocking_mode()?;
        let mut stream: Box<dyn ControlStream> = Box::new(stream);
        wire::send(
            &mut stream,
            &Msg::Hello {
                version: wire::VERSION,
                checksum: wire::fnv1a(ucx.worker_address()),
                address: ucx.worker_address().to_vec(),
            },
        )?;
        let mut reader = Reader::default();
        let deadline = Instant::now() + timeout;
        let address = loop {
            match reader.next(&mut stream)? {
                Read1::Msg(Msg::Hello { version, checksum, address }) if version == wire::VERSION => {
                    check_address(ucx, checksum, &address)?;
                    break address;
                }
                Read1::Msg(Msg::Hello { version, .. }) => {
                    return Err(UcxError::Protocol(format!(
                        "peer speaks protocol version {version}, this side {}",
                        wire::VERSION
                    )))
                }
                Read1::Msg(m) => {
                    return Err(UcxError::Protocol(format!("expected the peer's address, got {m:?}")))
                }
                Read1::Closed => {
                    return Err(UcxError::PeerLost("the control stream closed before the handshake".into()))
                }
                Read1::Nothing if Instant::now() >= deadline => {
                    return Err(UcxError::Timeout {
                        what: "waiting for the peer's worker address".into(),
                        after: timeout,
                    })
                }
                Read1::Nothing => std::thread::sleep(Duration::from_micros(200)),
            }
        };
        let ep = Endpoint::connect(&ucx.inner, &address, mode)?;
        Ok(Peer {
            ucx: ucx.clone(),
            stream,
            reader,
            ep,
            next_id: 1,
            exported: HashMap::new(),
            imported: HashMap::new(),
            offers: VecDeque::new(),
            gone: HashMap::new(),
            lost: None,
            turns: 0,
            active: Instant::now(),
        })
    }

    /// Why the peer is lost, if it is.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// Ranges offered to the peer that it still holds.
    pub fn exported(&self) -> usize {
        self.exported.len()
    }

    /// Offers `reg` to the peer with `tag`: the peer may reach it until it
    /// releases it or [`revoke`](Self::revoke) succeeds; the registration
    /// cannot be deregistered before.
    pub fn offer(&mut self, reg: &Registration, tag: u64) -> Result<u64, UcxError> {
        self.check_lost()?;
        let rkey = reg.pack()?;
        let id = self.next_id;
        self.next_id += 1;
        reg.inner.add_hold();
        let m = Msg::Offer {
            id,
            addr: reg.addr(),
            len: reg.len(),
            writable: reg.access() == Access::ReadWrite,
            checksum: wire::fnv1a(&rkey),
            rkey,
            tag,
        };
        if let Err(e) = wire::send(&mut self.stream, &m) {
            reg.inner.release_hold();
            return Err(e);
        }
        self.exported.insert(id, reg.inner.clone());
        Ok(id)
    }

    /// The next range the peer offers, waiting up to `timeout`.
    pub fn next_offer(&mut self, timeout: Duration) -> Result<RemoteRange, UcxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.offers.pop_front() {
                return Ok(r);
            }
            self.check_lost()?;
            if Instant::now() >= deadline {
                return Err(UcxError::Timeout {
                    what: "waiting for the peer's offer".into(),
                    after: timeout,
                });
            }
            self.turn()?;
        }
    }

    /// Serves the peer (progress for its reads and writes of this side's
    /// memory, control messages) until it says goodbye or is lost
    /// (`Ok(reason)`), or until `timeout` (`Timeout`).
    pub fn serve(&mut self, timeout: Duration) -> Result<String, UcxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(why) = &self.lost {
                return Ok(why.clone());
            }
            if Instant::now() >= deadline {
                return Err(UcxError::Timeout { what: "serving the peer".into(), after: timeout });
            }
            self.turn()?;
        }
    }

    /// One progress pass; the control stream every 64th pass and when idle
    /// (a read is a system call, a progress pass often is not); a pause
    /// only after 2 ms without either, so a peer's transfers through
    /// this side's worker (TCP, shared-memory emulated RMA) run at full
    /// speed and an idle wait costs little CPU.
    fn turn(&mut self) -> Result<(), UcxError> {
        let progressed = self.ucx.progress();
        self.turns = self.turns.wrapping_add(1);
        let now = Instant::now();
        let idle = !progressed && now.duration_since(self.active) > Duration::from_millis(2);
        let handled = if self.turns % 64 == 0 || idle { self.pump()? } else { false };
        if progressed || handled {
            self.active = now;
        } else if idle {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Handles every control message already arrived; `true` if any.
    pub fn pump(&mut self) -> Result<bool, UcxError> {
        let mut any = false;
        while self.lost.is_none() {
            match self.reader.next(&mut self.stream)? {
                Read1::Nothing => break,
                Read1::Closed => self.mark_lost("the control stream closed".into()),
                Read1::Msg(m) => {
                    any = true;
                    self.handle(m)?;
                }
            }
        }
        if self.lost.is_none() {
            if let Some(s) = self.ep.error() {
                self.mark_lost(format!("the endpoint failed: {}", self.ucx.inner.ucp.describe(s)));
            }
        }
        if self.imported.values().any(|i| i.closing.is_some()) {
            self.finish_closing()?;
        }
        Ok(any)
    }

    fn handle(&mut self, m: Msg) -> Result<(), UcxError> {
        match m {
            Msg::Offer { id, addr, len, writable, rkey, tag, checksum } => {
                if wire::fnv1a(&rkey) != checksum || rkey.is_empty() {
                    return Err(UcxError::Protocol(format!(
                        "offer {id}: the remote key ({} B) does not match its checksum",
                        rkey.len()
                    )));
                }
                if addr.checked_add(len).is_none() || len == 0 {
                    return Err(UcxError::Protocol(format!(
                        "offer {id}: range {addr:#x} ({len} B) is not a range"
                    )));
                }
                let key = Arc::new(self.ep.unpack(&rkey)?);
                let range = RemoteRange { id, addr, len, writable, tag };
                self.imported.insert(id, Imported { range, key, transfers: Vec::new(), closing: None });
                self.offers.push_back(range);
            }
            Msg::Release { id } | Msg::RevokeAck { id } => {
                if let Some(reg) = self.exported.remove(&id) {
                    reg.release_hold();
                }
            }
            Msg::Revoke { id } => {
                // Stop using the range: no new transfer; acknowledged once
                // what is in flight on it has completed (waited for here
                // up to 5 s; later by `pump` if need be).
                self.offers.retain(|r| r.id != id);
                self.gone.insert(id, "revoked by its owner (deregistered)");
                match self.imported.get_mut(&id) {
                    Some(imp) => {
                        imp.closing = Some(Closing::Revoked);
                        let deadline = Instant::now() + Duration::from_secs(5);
                        for t in &imp.transfers {
                            let _ = t.wait(deadline.saturating_duration_since(Instant::now()));
                        }
                    }
                    // Released here already, or never held: nothing in
                    // flight; acknowledge so the owner's wait ends.
                    None => wire::send(&mut self.stream, &Msg::RevokeAck { id })?,
                }
                self.finish_closing()?;
            }
            Msg::Bye => self.mark_lost("the peer said goodbye".into()),
            Msg::Hello { .. } => return Err(UcxError::Protocol("a second handshake".into())),
        }
        Ok(())
    }

    /// The peer is gone: force-close the endpoint (cancels what is in
    /// flight to it) and give back every hold it had on this side's ranges.
    fn mark_lost(&mut self, why: String) {
        if self.lost.is_some() {
            return;
        }
        self.ep.close(true, Duration::from_secs(1));
        for imp in self.imported.values() {
            for t in &imp.transfers {
                t.is_complete();
            }
        }
        for (_, reg) in self.exported.drain() {
            reg.release_hold();
        }
        self.lost = Some(why);
    }

    fn check_lost(&self) -> Result<(), UcxError> {
        match &self.lost {
            Some(why) => Err(UcxError::PeerLost(why.clone())),
            None => Ok(()),
        }
    }

    /// Asks the peer to stop using range `id` (offered by this side) and
    /// waits up to `timeout` for its acknowledgement; afterwards the
    /// registration may be deregistered. A peer lost meanwhile counts as
    /// an acknowledgement. On timeout the range stays held (and resident).
    pub fn revoke(&mut self, id: u64, timeout: Duration) -> Result<(), UcxError> {
        if !self.exported.contains_key(&id) {
            return Err(UcxError::Invalid(format!(
                "range {id} was not offered to this peer, or is already back"
            )));
        }
        if self.lost.is_none() {
            wire::send(&mut self.stream, &Msg::Revoke { id }).or_else(|e| match e {
                UcxError::PeerLost(why) => {
                    self.mark_lost(why);
                    Ok(())
                }
                e => Err(e),
            })?;
        }
        let deadline = Instant::now() + timeout;
        while self.exported.contains_key(&id) {
            if Instant::now() >= deadline {
                return Err(UcxError::Timeout {
                    what: format!("revoking range {id} (the peer did not acknowledge; it stays registered)"),
                    after: timeout,
                });
            }
            self.turn()?;
        }
        Ok(())
    }

    /// Gives range `range` back to its owner after waiting (up to
    /// `timeout`) for this side's transfers on it, flushed so that its
    /// writes are complete at the owner before the owner hears of it.
    pub fn release(&mut self, range: &RemoteRange, timeout: Duration) -> Result<(), UcxError> {
        let imp = match self.imported.get_mut(&range.id) {
            Some(imp) if imp.closing.is_none() => imp,
            _ => return Err(self.gone_error(range.id)),
        };
        imp.closing = Some(Closing::Released);
        let mut result = Ok(());
        let deadline = Instant::now() + timeout;
        for t in &imp.transfers {
            if let Err(e) = t.wait(deadline.saturating_duration_since(Instant::now())) {
                result = Err(e);
            }
        }
        self.gone.insert(range.id, "released by this side");
        self.finish_closing()?;
        if self.imported.contains_key(&range.id) {
            // A transfer could not be cancelled (ErrorHandling::None): the
            // owner is told when it completes (`pump`), not before.
            return Err(UcxError::Busy(format!(
                "range {} has transfers still in flight; it is given back when they complete",
                range.id
            )));
        }
        result
    }

    /// Tells the owner of every range being given back whose transfers
    /// have all completed, after a flush (so this side's writes are
    /// complete at the owner before it hears).
    fn finish_closing(&mut self) -> Result<(), UcxError> {
        let done: Vec<(u64, Closing)> = self
            .imported
            .iter()
            .filter_map(|(&id, imp)| {
                let closing = imp.closing?;
                imp.transfers.iter().all(|t| t.is_complete()).then_some((id, closing))
            })
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        if self.lost.is_none() {
            let _ = self.ep.flush(Duration::from_secs(5));
        }
        for (id, closing) in done {
            self.imported.remove(&id);
            if self.lost.is_none() {
                let m = match closing {
                    Closing::Released => Msg::Release { id },
                    Closing::Revoked => Msg::RevokeAck { id },
                };
                wire::send(&mut self.stream, &m)?;
            }
        }
        Ok(())
    }

    fn gone_error(&self, id: u64) -> UcxError {
        match self.gone.get(&id) {
            Some(why) => UcxError::Revoked { id, why },
            None => UcxError::Invalid(format!("range {id} was never offered by this peer")),
        }
    }

    /// Checks that `range` is still held (pumping control messages first,
    /// so a revoke already sent is seen), that `[offset, +len)` is inside
    /// it, and that a put targets a writable range.
    pub(crate) fn check_remote(
        &mut self,
        range: &RemoteRange,
        offset: u64,
        len: u64,
        dir: Direction,
    ) -> Result<(), UcxError> {
        self.pump()?;
        self.check_lost()?;
        let imp = match self.imported.get(&range.id) {
            Some(imp) if imp.closing.is_none() => imp,
            _ => return Err(self.gone_error(range.id)),
        };
        let r = imp.range;
        if len == 0 || offset.checked_add(len).is_none_or(|e| e > r.len) {
            return Err(UcxError::Invalid(format!(
                "+{offset} ({len} B) is not inside remote range {} ({} B)",
                r.id, r.len
            )));
        }
        if dir == Direction::Put && !r.writable {
            return Err(UcxError::Invalid(format!(
                "remote range {} is read-only (offered with Access::Read)",
                r.id
            )));
        }
        Ok(())
    }

    /// Issues a transfer between local memory and `[offset, +len)` of
    /// `range`, after checking the range is still held and inside bounds.
    ///
    /// # Safety
    /// `local` must stay valid for `len` bytes (writable for a get) until
    /// the transfer completes.
    pub(crate) unsafe fn transfer(
        &mut self,
        dir: Direction,
        range: &RemoteRange,
        offset: u64,
        local: u64,
        len: u64,
    ) -> Result<Transfer, UcxError> {
        self.check_remote(range, offset, len, dir)?;
        let imp = self.imported.get_mut(&range.id).expect("checked");
        let r = imp.range;
        let what = format!(
            "{} of {len} B {} remote range {} +{offset}",
            if dir == Direction::Get { "get" } else { "put" },
            if dir == Direction::Get { "from" } else { "to" },
            r.id
        );
        // SAFETY: the caller vouches for the local side; the remote side
        // is inside a range its owner keeps registered until we release.
        let t = unsafe { Transfer::issue(&imp.key, dir, local, r.addr + offset, len, what)? };
        imp.transfers.retain(|t| !t.is_complete());
        imp.transfers.push(t.clone());
        Ok(t)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if self.lost.is_none() {
            // One second in all for what is still in flight (a transfer
            // past it is cancelled in peer mode; see ErrorHandling::None).
            let deadline = Instant::now() + Duration::from_secs(1);
            for imp in self.imported.values() {
                for t in &imp.transfers {
                    let _ = t.wait(deadline.saturating_duration_since(Instant::now()));
                }
            }
            let _ = wire::send(&mut self.stream, &Msg::Bye);
        }
        self.imported.clear();
        self.mark_lost("dropped".into());
    }
}

/// What can be checked of a peer's worker address before UCX reads it.
/// UCX does not validate an address: a malformed one aborts the process
/// (an assertion in `ucp_address_unpack`). So the address must be intact
/// (its checksum) and of this UCX's address format (its first byte, the
/// format version and flags, equal to this worker's). Beyond that the
/// control stream must come from a trusted process: a peer that sends a
/// well-formed but false address can still crash this one, as it can any
/// UCX program it talks to.
fn check_address(ucx: &Ucx, checksum: u64, address: &[u8]) -> Result<(), UcxError> {
    if wire::fnv1a(address) != checksum {
        return Err(UcxError::Protocol(format!(
            "the peer's worker address ({} B) does not match its checksum: damaged on the way",
            address.len()
        )));
    }
    let ours = ucx.worker_address();
    if address.len() < 2 || address[0] != ours[0] {
        return Err(UcxError::Protocol(format!(
            "the peer's worker address ({} B, header {:#04x}) is not of this UCX's address format (header \
             {:#04x}): a peer with another UCX version, or not a UCX address",
            address.len(),
            address.first().copied().unwrap_or(0),
            ours[0]
        )));
    }
    Ok(())
}
