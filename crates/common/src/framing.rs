//! Newline-delimited JSON-RPC framing, shared by every stdio wire: the modern server's
//! stdio transport, the gateway's stdio host bridge and its stdio upstream. A line is
//! one message; its length is bounded so that a peer that never sends `\n` cannot make
//! a reader buffer without limit.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Reads one line of at most `max` bytes. `Ok(None)` at EOF; an over-long line is
/// consumed to its end and reported as `Err(())`.
pub async fn read_bounded_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<Result<(), ()>>> {
    buf.clear();
    let mut too_long = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if buf.is_empty() && !too_long {
                None
            } else if too_long {
                Some(Err(()))
            } else {
                Some(Ok(()))
            });
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max + 1 {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        reader.consume(take);
        if done {
            if too_long {
                return Ok(Some(Err(())));
            }
            while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                buf.pop();
            }
            return Ok(Some(Ok(())));
        }
    }
}
