//! Container logs as `pods/log` serves them: the current or `previous` instance's file, the last
//! `tailLines`, and `follow` streaming new output until that instance ends.

use super::process::ContainerRun;
use bytes::Bytes;
use std::io::SeekFrom;
use std::io::{Read, Seek};
use std::sync::Arc;
use std::time::Duration;

/// Which log to read.
#[derive(Debug, Clone, Default)]
pub struct LogRequest {
    pub previous: bool,
    pub tail_lines: Option<usize>,
    pub follow: bool,
}

/// The last `n` lines of `text` (all of it without `n`).
pub fn tail(text: &[u8], n: Option<usize>) -> &[u8] {
    let Some(n) = n else {
        return text;
    };
    if n == 0 {
        return &text[text.len()..];
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

/// The instance a request reads; `None` when `previous` asks for one that never ran.
pub(crate) fn instance(c: &ContainerRun, previous: bool) -> Option<u32> {
    let (current, _) = c.instance();
    if previous {
        return current.checked_sub(1);
    }
    Some(current)
}

/// The log content, or a stream of it when following.
pub(crate) async fn open(
    c: Arc<ContainerRun>,
    instance: u32,
    req: &LogRequest,
) -> std::io::Result<futures::stream::BoxStream<'static, std::io::Result<Bytes>>> {
    use futures::StreamExt;
    let path = c.log_path(instance);
    // Log files are local and small reads; std::fs keeps tokio's `fs` feature out.
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let first = Bytes::copy_from_slice(tail(&text, req.tail_lines));
    let offset = text.len() as u64;
    if !req.follow {
        return Ok(futures::stream::once(async move { Ok(first) }).boxed());
    }
    struct Follow {
        c: Arc<ContainerRun>,
        path: std::path::PathBuf,
        instance: u32,
        offset: u64,
    }
    let state = Follow {
        c,
        path,
        instance,
        offset,
    };
    let more = futures::stream::unfold(state, |mut st| async move {
        loop {
            // Read what the instance wrote since; finish once it ended and all is read.
            let (current, running) = st.c.instance();
            let ended = current != st.instance || !running;
            let mut chunk = Vec::new();
            if let Ok(mut f) = std::fs::File::open(&st.path)
                && f.seek(SeekFrom::Start(st.offset)).is_ok()
            {
                let _ = f.read_to_end(&mut chunk);
            }
            if !chunk.is_empty() {
                st.offset += chunk.len() as u64;
                return Some((Ok(Bytes::from(chunk)), st));
            }
            if ended {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    Ok(futures::stream::once(async move { Ok(first) })
        .chain(more)
        .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let text = b"one\ntwo\nthree\n";
        assert_eq!(tail(text, None), text);
        assert_eq!(tail(text, Some(1)), b"three\n");
        assert_eq!(tail(text, Some(2)), b"two\nthree\n");
        assert_eq!(tail(text, Some(5)), text);
        assert_eq!(tail(text, Some(0)), b"");
        assert_eq!(tail(b"a\nb", Some(1)), b"b");
    }
}
