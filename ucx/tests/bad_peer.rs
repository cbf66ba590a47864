//! A peer that sends garbage: the handshake refuses it with a clear error.

mod common;

use memplug_ucx::{Peer, UcxError};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend((payload.len() as u32).to_le_bytes());
    f.extend(payload);
    f
}

fn handshake_with(bytes: &[u8]) -> UcxError {
    let ucx = common::ucx(common::TCP);
    let (a, mut b) = UnixStream::pair().unwrap();
    b.write_all(bytes).unwrap();
    match Peer::connect(&ucx, a, Duration::from_millis(300)) {
        Ok(_) => panic!("a garbage handshake was accepted"),
        Err(e) => e,
    }
}

#[test]
fn garbage_handshakes_are_refused() {
    let Some(()) = common::ucx_or_skip("garbage_handshakes_are_refused") else { return };
    let e = handshake_with(&frame(1, &[]));
    assert!(e.to_string().contains("too short"), "{e}");
    let e = handshake_with(&frame(1, &2u64.to_le_bytes()));
    assert!(e.to_string().contains("protocol version 2"), "{e}");
    let e = handshake_with(&frame(6, &[]));
    assert!(e.to_string().contains("expected the peer's address"), "{e}");
    let e = handshake_with(&[]);
    assert!(matches!(e, UcxError::Timeout { .. }), "{e}");
    let mut huge = vec![1u8];
    huge.extend(u32::MAX.to_le_bytes());
    let e = handshake_with(&huge);
    assert!(e.to_string().contains("exceeds"), "{e}");
    // A damaged address (checksum) and one not of this UCX's format: UCX
    // would abort the process on either.
    let mut hello = 1u64.to_le_bytes().to_vec();
    hello.extend(0u64.to_le_bytes());
    hello.extend([0x20u8; 64]);
    let e = handshake_with(&frame(1, &hello));
    assert!(e.to_string().contains("does not match its checksum"), "{e}");
    let junk = [0xA5u8; 64];
    let mut hello = 1u64.to_le_bytes().to_vec();
    hello.extend(fnv1a(&junk).to_le_bytes());
    hello.extend(junk);
    let e = handshake_with(&frame(1, &hello));
    assert!(e.to_string().contains("not of this UCX's address format"), "{e}");
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
