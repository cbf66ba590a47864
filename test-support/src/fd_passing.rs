//! Two-process tests of sharing: a descriptor sent to a child over a Unix
//! socket (`SCM_RIGHTS`) with a small payload, and the wait for the child
//! to connect, which fails with the child's output when it exits first.

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// Sends `fd` and `payload` (at most 64 bytes) in one message.
pub fn send_fd(stream: &UnixStream, fd: BorrowedFd<'_>, payload: &[u8]) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    let n = sendmsg(stream, &[IoSlice::new(payload)], &mut control, SendFlags::empty()).unwrap();
    assert_eq!(n, payload.len());
}

/// Receives one descriptor (close-on-exec) and its payload.
pub fn recv_fd(stream: &UnixStream) -> (OwnedFd, Vec<u8>) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 64];
    let got =
        recvmsg(stream, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::CMSG_CLOEXEC).unwrap();
    let fd = control
        .drain()
        .find_map(|m| match m {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        })
        .expect("the message carried a descriptor (SCM_RIGHTS)");
    (fd, buf[..got.bytes].to_vec())
}

/// The connection of `child` to `listener` (made non-blocking here), within
/// `timeout`; panics with the child's output (`describe`) if it exits
/// before connecting. The stream returned blocks, with a read timeout of
/// `timeout`.
pub fn accept_child(
    listener: &UnixListener,
    child: &mut Child,
    timeout: Duration,
    describe: impl Fn(&Output) -> String,
) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + timeout;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    let out = exited_output(child, status);
                    panic!("the child exited ({status}) before connecting:\n{}", describe(&out));
                }
                assert!(Instant::now() < deadline, "the child did not connect within {timeout:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(timeout)).unwrap();
    stream
}

/// What an exited child printed (its piped stdout and stderr, if any).
fn exited_output(child: &mut Child, status: std::process::ExitStatus) -> Output {
    let mut out = Output { status, stdout: Vec::new(), stderr: Vec::new() };
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut out.stdout);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut out.stderr);
    }
    out
}
