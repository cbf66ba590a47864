//! The control messages two peers exchange over a byte stream (a Unix
//! socket on one machine; any reliable stream between nodes): worker
//! addresses, offers of registered ranges with their remote keys, and the
//! release/revoke handshake that lets an owner deregister only when the
//! peer can no longer reach the range.
//!
//! A frame is `[kind: u8][length: u32 LE][payload]`; integers are
//! little-endian u64. A frame longer than [`MAX_FRAME`] is refused (a
//! corrupt or hostile peer cannot make this side allocate without bound).

use crate::error::UcxError;
use std::io::{ErrorKind, Read, Write};

/// The largest payload accepted (a worker address or a packed key is a
/// few hundred bytes to a few KiB).
pub const MAX_FRAME: u32 = 1 << 20;

/// One control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// The sender's worker address and protocol version; the checksum
    /// (FNV-1a, 64 bits, of the address) catches an address damaged on the
    /// way, which UCX would not survive (see `Peer::connect`).
    Hello { version: u64, checksum: u64, address: Vec<u8> },
    /// A registered range the receiver may reach until it releases it or
    /// the sender revokes it.
    /// `checksum` is the packed key's FNV-1a (UCX does not validate a key
    /// it unpacks either).
    Offer { id: u64, addr: u64, len: u64, writable: bool, rkey: Vec<u8>, tag: u64, checksum: u64 },
    /// The receiver of an offer is done with it (no transfer in flight).
    Release { id: u64 },
    /// The owner wants the range back.
    Revoke { id: u64 },
    /// The holder has stopped using a revoked range.
    RevokeAck { id: u64 },
    /// The sender is leaving.
    Bye,
}

pub(crate) const VERSION: u64 = 1;

/// FNV-1a, 64 bits: a checksum against damage, not an authenticator.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

impl Msg {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::new();
        let kind = match self {
            Msg::Hello { version, checksum, address } => {
                p.extend(version.to_le_bytes());
                p.extend(checksum.to_le_bytes());
                p.extend(address);
                1
            }
            Msg::Offer { id, addr, len, writable, rkey, tag, checksum } => {
                for v in [*id, *addr, *len, *writable as u64, *tag, *checksum] {
                    p.extend(v.to_le_bytes());
                }
                p.extend(rkey);
                2
            }
            Msg::Release { id } => {
                p.extend(id.to_le_bytes());
                3
            }
            Msg::Revoke { id } => {
                p.extend(id.to_le_bytes());
                4
            }
            Msg::RevokeAck { id } => {
                p.extend(id.to_le_bytes());
                5
            }
            Msg::Bye => 6,
        };
        let mut f = Vec::with_capacity(5 + p.len());
        f.push(kind);
        f.extend((p.len() as u32).to_le_bytes());
        f.extend(p);
        f
    }

    pub(crate) fn decode(kind: u8, p: &[u8]) -> Result<Msg, UcxError> {
        let word = |i: usize| -> Result<u64, UcxError> {
            p.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(|| UcxError::Protocol(format!("message {kind} too short ({} B)", p.len())))
        };
        Ok(match kind {
            1 => {
                let version = word(0)?;
                // A peer of another version may lay the rest out otherwise:
                // its version is enough to refuse it.
                let checksum = if version == VERSION { word(1)? } else { 0 };
                Msg::Hello { version, checksum, address: p.get(16..).unwrap_or_default().to_vec() }
            }
            2 => {
                let (id, addr, len, w, tag, checksum) =
                    (word(0)?, word(1)?, word(2)?, word(3)?, word(4)?, word(5)?);
                Msg::Offer { id, addr, len, writable: w != 0, rkey: p[48..].to_vec(), tag, checksum }
            }
            3 => Msg::Release { id: word(0)? },
            4 => Msg::Revoke { id: word(0)? },
            5 => Msg::RevokeAck { id: word(0)? },
            6 => Msg::Bye,
            k => return Err(UcxError::Protocol(format!("unknown message kind {k}"))),
        })
    }
}

/// Accumulates bytes from a non-blocking stream into whole frames.
#[derive(Default)]
pub(crate) struct Reader {
    buf: Vec<u8>,
}

/// What one read pass found.
pub(crate) enum Read1 {
    Msg(Msg),
    /// Nothing whole yet.
    Nothing,
    /// The peer closed the stream.
    Closed,
}

impl Reader {
    /// Reads what is available (the stream is non-blocking) and returns
    /// the next whole message, if any.
    pub(crate) fn next(&mut self, s: &mut impl Read) -> Result<Read1, UcxError> {
        if let Some(m) = self.take()? {
            return Ok(Read1::Msg(m));
        }
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => return Ok(Read1::Closed),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    if let Some(m) = self.take()? {
                        return Ok(Read1::Msg(m));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Read1::Nothing),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(Read1::Closed),
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn take(&mut self) -> Result<Option<Msg>, UcxError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buf[1..5].try_into().expect("4 bytes"));
        if len > MAX_FRAME {
            return Err(UcxError::Protocol(format!("frame of {len} B exceeds {MAX_FRAME} B")));
        }
        let end = 5 + len as usize;
        if self.buf.len() < end {
            return Ok(None);
        }
        let m = Msg::decode(self.buf[0], &self.buf[5..end]);
        self.buf.drain(..end);
        m.map(Some)
    }
}

/// Writes a whole frame on a non-blocking stream (waiting out
/// `WouldBlock`: frames are small, the peer's buffer drains quickly).
pub(crate) fn send(s: &mut impl Write, m: &Msg) -> Result<(), UcxError> {
    let f = m.encode();
    let mut at = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while at < f.len() {
        match s.write(&f[at..]) {
            Ok(0) => return Err(UcxError::PeerLost("control socket closed".into())),
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if std::time::Instant::now() > deadline {
                    return Err(UcxError::Timeout {
                        what: "sending a control message".into(),
                        after: std::time::Duration::from_secs(5),
                    });
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                return Err(UcxError::PeerLost(format!("control socket: {e}")))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let msgs = [
            Msg::Hello { version: 1, checksum: fnv1a(&[1, 2, 3]), address: vec![1, 2, 3] },
            Msg::Offer {
                id: 7,
                addr: 0x1000,
                len: 4096,
                writable: true,
                rkey: vec![9; 40],
                tag: 3,
                checksum: 5,
            },
            Msg::Release { id: 7 },
            Msg::Revoke { id: 8 },
            Msg::RevokeAck { id: 8 },
            Msg::Bye,
        ];
        let mut bytes: Vec<u8> = msgs.iter().flat_map(|m| m.encode()).collect();
        let mut r = Reader::default();
        let mut cur = std::io::Cursor::new(std::mem::take(&mut bytes));
        for m in &msgs {
            match r.next(&mut cur).unwrap() {
                Read1::Msg(got) => assert_eq!(&got, m),
                _ => panic!("expected {m:?}"),
            }
        }
        assert!(matches!(r.next(&mut cur).unwrap(), Read1::Closed));
        let mut huge = vec![2u8];
        huge.extend((MAX_FRAME + 1).to_le_bytes());
        let e = Reader::default().next(&mut std::io::Cursor::new(huge)).err().unwrap();
        assert!(e.to_string().contains("exceeds"), "{e}");
        let e = Reader::default().next(&mut std::io::Cursor::new(
            Msg::Release { id: 1 }.encode()[..5].iter().chain(&[0u8; 0]).copied().collect::<Vec<_>>(),
        ));
        assert!(matches!(e, Ok(Read1::Closed)));
        let e = Msg::decode(3, &[1, 2]).unwrap_err();
        assert!(e.to_string().contains("too short"), "{e}");
        let e = Msg::decode(99, &[]).unwrap_err();
        assert!(e.to_string().contains("unknown message kind 99"), "{e}");
    }
}
