//! The authority's protocol on the wire: length-prefixed frames over a Unix
//! stream socket. A frame is a little-endian `u32` body length (at most
//! [`MAX_FRAME`]) and a body: one kind byte, then the kind's fields in
//! order — integers little-endian, a string as a `u16` length and UTF-8
//! bytes. Decoding checks every length against what is left: a truncated or
//! oversized frame is an error with a reason, never a panic.

use std::io::{self, Read, Write};

/// The protocol's version, sent in `Hello`; the authority refuses others
/// (3: `Hello` declares each device's classes).
pub const VERSION: u32 = 3;
/// The largest body a frame may have: a frame claiming more is refused
/// before anything is read into memory.
pub const MAX_FRAME: u32 = 64 * 1024;

/// One device's part of a `Hello`: its name, the priority the process's
/// holders have on it (lower is asked first under pressure), the classes
/// of memory it holds there (a [`ClassMask`]: only requests of those
/// classes press it; protocol 3), and the bytes the process already holds
/// (a rejoin after the authority restarted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub device: String,
    pub priority: u32,
    pub classes: ClassMask,
    pub holding: u64,
}

/// A set of allocation classes: bit `c` for the class whose discriminant
/// (`AllocationClass as u8`) is `c`. [`ALL_CLASSES`] (or 0, read as all):
/// a member pressed for a request of any class, as before protocol 3.
pub type ClassMask = u8;

/// Every class `memplug_host` has (weights, kv, activations, workspace,
/// other).
pub const ALL_CLASSES: ClassMask = (1 << memplug_host::governor::AllocationClass::COUNT) - 1;

/// A message, either way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Process → authority, first: who it is and what it holds.
    Hello { version: u32, devices: Vec<Declared> },
    /// Authority → process: the chunk size and the devices it governs.
    Welcome { chunk: u64, devices: Vec<(String, u64)> },
    /// Process → authority: lease at least `min` bytes, `want` if free, on
    /// `device`, pressing other processes for up to `wait_ms`. `class` (an
    /// `AllocationClass` discriminant) and `priority` are the request's:
    /// only processes of equal or lower priority are pressed, and their
    /// holders see the class (protocol 2).
    Lease { req: u64, device: String, min: u64, want: u64, wait_ms: u64, class: u8, priority: u32 },
    /// Authority → process: the bytes leased for request `req`.
    Granted { req: u64, bytes: u64 },
    /// Authority → process: request `req` refused, and why.
    Refused { req: u64, reason: String },
    /// Process → authority: bytes of `device` it no longer holds.
    Return { device: String, bytes: u64 },
    /// Authority → process: give back up to `bytes` of `device` for a
    /// request of `class` at `priority` that waits up to `wait_ms`: the
    /// process asks its holders of equal or lower priority (protocol 2).
    Ticket { ticket: u64, device: String, bytes: u64, class: u8, priority: u32, wait_ms: u64 },
    /// Process → authority: the bytes released for ticket `ticket`.
    Answer { ticket: u64, released: u64 },
    /// Process → authority: the books, as JSON (`prometheus`: as
    /// Prometheus text).
    Status { prometheus: bool },
    /// Authority → process: the books asked for.
    StatusReply { text: String },
    /// Authority → process: a message was refused (it changed nothing).
    Error { reason: String },
}

const HELLO: u8 = 1;
const LEASE: u8 = 2;
const RETURN: u8 = 3;
const ANSWER: u8 = 4;
const STATUS: u8 = 5;
const WELCOME: u8 = 64;
const GRANTED: u8 = 65;
const REFUSED: u8 = 66;
const TICKET: u8 = 67;
const STATUS_REPLY: u8 = 68;
const ERROR: u8 = 69;

impl Msg {
    /// The frame of this message (length prefix included).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Body(vec![0; 4]);
        match self {
            Msg::Hello { version, devices } => {
                b.u8(HELLO).u32(*version).u16(devices.len() as u16);
                for d in devices {
                    b.str(&d.device).u32(d.priority).u8(d.classes).u64(d.holding);
                }
            }
            Msg::Welcome { chunk, devices } => {
                b.u8(WELCOME).u64(*chunk).u16(devices.len() as u16);
                for (name, capacity) in devices {
                    b.str(name).u64(*capacity);
                }
            }
            Msg::Lease { req, device, min, want, wait_ms, class, priority } => {
                b.u8(LEASE)
                    .u64(*req)
                    .str(device)
                    .u64(*min)
                    .u64(*want)
                    .u64(*wait_ms)
                    .u8(*class)
                    .u32(*priority);
            }
            Msg::Granted { req, bytes } => {
                b.u8(GRANTED).u64(*req).u64(*bytes);
            }
            Msg::Refused { req, reason } => {
                b.u8(REFUSED).u64(*req).str(reason);
            }
            Msg::Return { device, bytes } => {
                b.u8(RETURN).str(device).u64(*bytes);
            }
            Msg::Ticket { ticket, device, bytes, class, priority, wait_ms } => {
                b.u8(TICKET).u64(*ticket).str(device).u64(*bytes).u8(*class).u32(*priority).u64(*wait_ms);
            }
            Msg::Answer { ticket, released } => {
                b.u8(ANSWER).u64(*ticket).u64(*released);
            }
            Msg::Status { prometheus } => {
                b.u8(STATUS).u8(*prometheus as u8);
            }
            Msg::StatusReply { text } => {
                b.u8(STATUS_REPLY).long_str(text);
            }
            Msg::Error { reason } => {
                b.u8(ERROR).str(reason);
            }
        }
        let len = (b.0.len() - 4) as u32;
        b.0[..4].copy_from_slice(&len.to_le_bytes());
        b.0
    }

    /// Decodes one body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Msg, String> {
        let mut r = Reader { rest: body };
        let kind = r.u8()?;
        let msg = match kind {
            HELLO => {
                let version = r.u32()?;
                if version != VERSION {
                    // Another protocol's Hello: its devices are not read
                    // (their layout is that protocol's), so the authority
                    // can say which protocols differ instead of
                    // "truncated".
                    return Ok(Msg::Hello { version, devices: Vec::new() });
                }
                let n = r.u16()?;
                let mut devices = Vec::new();
                for _ in 0..n {
                    devices.push(Declared {
                        device: r.str()?,
                        priority: r.u32()?,
                        classes: r.u8()?,
                        holding: r.u64()?,
                    });
                }
                Msg::Hello { version, devices }
            }
            WELCOME => {
                let chunk = r.u64()?;
                let n = r.u16()?;
                let mut devices = Vec::new();
                for _ in 0..n {
                    devices.push((r.str()?, r.u64()?));
                }
                Msg::Welcome { chunk, devices }
            }
            LEASE => Msg::Lease {
                req: r.u64()?,
                device: r.str()?,
                min: r.u64()?,
                want: r.u64()?,
                wait_ms: r.u64()?,
                class: r.u8()?,
                priority: r.u32()?,
            },
            GRANTED => Msg::Granted { req: r.u64()?, bytes: r.u64()? },
            REFUSED => Msg::Refused { req: r.u64()?, reason: r.str()? },
            RETURN => Msg::Return { device: r.str()?, bytes: r.u64()? },
            TICKET => Msg::Ticket {
                ticket: r.u64()?,
                device: r.str()?,
                bytes: r.u64()?,
                class: r.u8()?,
                priority: r.u32()?,
                wait_ms: r.u64()?,
            },
            ANSWER => Msg::Answer { ticket: r.u64()?, released: r.u64()? },
            STATUS => Msg::Status { prometheus: r.u8()? != 0 },
            STATUS_REPLY => Msg::StatusReply { text: r.long_str()? },
            ERROR => Msg::Error { reason: r.str()? },
            k => return Err(format!("unknown message kind {k}")),
        };
        if !r.rest.is_empty() {
            return Err(format!("{} bytes after the end of a {} message", r.rest.len(), msg.name()));
        }
        Ok(msg)
    }

    /// The message's kind, for refusals.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "Hello",
            Msg::Welcome { .. } => "Welcome",
            Msg::Lease { .. } => "Lease",
            Msg::Granted { .. } => "Granted",
            Msg::Refused { .. } => "Refused",
            Msg::Return { .. } => "Return",
            Msg::Ticket { .. } => "Ticket",
            Msg::Answer { .. } => "Answer",
            Msg::Status { .. } => "Status",
            Msg::StatusReply { .. } => "StatusReply",
            Msg::Error { .. } => "Error",
        }
    }
}

/// What reading a frame gave.
#[derive(Debug)]
pub enum Frame {
    /// A message.
    Msg(Msg),
    /// A frame whose body did not decode: the stream is still in step (the
    /// length was read), the frame is refused.
    Bad(String),
    /// The other end closed the stream.
    Closed,
}

/// Reads one frame. An oversized length is an `Err` (the stream cannot be
/// followed past it); I/O errors too.
pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Frame::Closed),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (the most is {MAX_FRAME})"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(match Msg::decode(&body) {
        Ok(m) => Frame::Msg(m),
        Err(e) => Frame::Bad(e),
    })
}

/// Writes one message.
pub fn write_msg(w: &mut impl Write, m: &Msg) -> io::Result<()> {
    w.write_all(&m.encode())
}

struct Body(Vec<u8>);

impl Body {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
        self.u16(b.len() as u16);
        self.0.extend_from_slice(b);
        self
    }
    fn long_str(&mut self, s: &str) -> &mut Self {
        let b = &s.as_bytes()[..s.len().min(MAX_FRAME as usize - 16)];
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.rest.len() < n {
            return Err(format!("truncated: {n} bytes wanted, {} left", self.rest.len()));
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string that is not UTF-8".to_string())
    }
    fn long_str(&mut self) -> Result<String, String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string that is not UTF-8".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Msg> {
        vec![
            Msg::Hello {
                version: VERSION,
                devices: vec![Declared { device: "cpu0".into(), priority: 3, classes: 0b10, holding: 7 }],
            },
            Msg::Welcome { chunk: 2 << 20, devices: vec![("cpu0".into(), 1 << 30)] },
            Msg::Lease {
                req: 1,
                device: "cpu0".into(),
                min: 5,
                want: 8,
                wait_ms: 100,
                class: 1,
                priority: 9,
            },
            Msg::Granted { req: 1, bytes: 8 },
            Msg::Refused { req: 1, reason: "no".into() },
            Msg::Return { device: "cpu0".into(), bytes: 9 },
            Msg::Ticket { ticket: 4, device: "cpu0".into(), bytes: 10, class: 0, priority: 9, wait_ms: 30 },
            Msg::Answer { ticket: 4, released: 10 },
            Msg::Status { prometheus: true },
            Msg::StatusReply { text: "{}".into() },
            Msg::Error { reason: "bad".into() },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in all() {
            let f = m.encode();
            let mut r = &f[..];
            match read_frame(&mut r).unwrap() {
                Frame::Msg(back) => assert_eq!(back, m),
                other => panic!("{m:?} came back as {other:?}"),
            }
        }
    }

    #[test]
    fn every_truncation_is_refused_with_a_reason_and_extra_bytes_too() {
        for m in all() {
            let f = m.encode();
            let body = &f[4..];
            for cut in 0..body.len() {
                let e = Msg::decode(&body[..cut]).unwrap_err();
                assert!(e.contains("truncated") || e.contains("unknown"), "{m:?} cut at {cut}: {e}");
            }
            let mut longer = body.to_vec();
            longer.push(0);
            assert!(Msg::decode(&longer).unwrap_err().contains("after the end"));
        }
    }

    /// A Hello of another protocol decodes to its version alone (the
    /// authority refuses it naming both protocols), whatever follows.
    #[test]
    fn a_hello_of_another_protocol_is_read_as_its_version() {
        let old = Msg::Hello { version: 2, devices: Vec::new() }.encode();
        let mut body = old[4..].to_vec();
        body.extend_from_slice(&[1, 0, 4, 0, b'c', b'p', b'u', b'0', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Msg::decode(&body), Ok(Msg::Hello { version: 2, devices: Vec::new() }));
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_read() {
        let mut f = (MAX_FRAME + 1).to_le_bytes().to_vec();
        f.extend_from_slice(&[0; 16]);
        let e = read_frame(&mut &f[..]).unwrap_err();
        assert!(e.to_string().contains("the most is"), "{e}");
    }
}
