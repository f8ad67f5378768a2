//! SPDY/3.1 framing as far as a port-forward session needs it (the protocol kubectl's
//! `port-forward` speaks, plainly upgraded or tunneled in WebSocket messages): the frames, and the
//! header blocks, zlib-compressed as one stream per direction with SPDY's preset dictionary.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;
/// The last frame the sender sends on this stream.
pub const FLAG_FIN: u8 = 0x01;
/// A frame's length is 24 bits; larger frames are refused rather than buffered.
const MAX_FRAME: usize = (1 << 24) - 1;
/// How much pod data one DATA frame carries.
pub const DATA_CHUNK: usize = 32 * 1024;
/// RST_STREAM status: the stream is refused (an unknown stream type, a bad port).
pub const REFUSED_STREAM: u32 = 3;

/// SPDY/3's header names, each as a 4-byte big-endian length and the name, then the tail below:
/// together the zlib dictionary both ends preset (SPDY/3 draft, section 2.6.10.1).
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];
const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
);

fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
}

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("reading or writing the SPDY connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("unsupported SPDY version {0} (3 expected)")]
    Version(u16),
    #[error("SPDY frame too short for its type {0}")]
    Short(u16),
    #[error("SPDY header block: {0}")]
    Headers(String),
}

impl SpdyError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::Version(_) => "version",
            Self::Short(_) => "short_frame",
            Self::Headers(_) => "header_block",
        }
    }
}

/// Header names (lower case, as SPDY/3 requires) and values, in order.
pub type Headers = Vec<(String, String)>;

#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    SynStream {
        stream: u32,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings,
    Ping(u32),
    GoAway {
        last_stream: u32,
        status: u32,
    },
    Headers {
        stream: u32,
    },
    WindowUpdate,
    Data {
        stream: u32,
        flags: u8,
        data: Vec<u8>,
    },
    /// A control frame type this server has no use for (ignored, as SPDY says).
    Unknown(u16),
}

/// One direction's header-block compression state (SPDY uses one zlib stream per direction).
pub struct HeaderCodec {
    compress: Compress,
    decompress: Decompress,
    dictionary: Vec<u8>,
}

impl Default for HeaderCodec {
    fn default() -> Self {
        let dictionary = dictionary();
        let mut compress = Compress::new(Compression::default(), true);
        // Cannot fail on a fresh stream with the zlib backend.
        let _ = compress.set_dictionary(&dictionary);
        Self {
            compress,
            decompress: Decompress::new(true),
            dictionary,
        }
    }
}

impl HeaderCodec {
    pub fn encode(&mut self, headers: &Headers) -> Vec<u8> {
        let mut plain = Vec::new();
        plain.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            for part in [name, value] {
                plain.extend_from_slice(&(part.len() as u32).to_be_bytes());
                plain.extend_from_slice(part.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = &plain[..];
        loop {
            out.reserve(64);
            let before = self.compress.total_in();
            let _ = self
                .compress
                .compress_vec(input, &mut out, FlushCompress::Sync);
            input = &input[(self.compress.total_in() - before) as usize..];
            // A sync flush is complete when output space was left over.
            if input.is_empty() && out.len() < out.capacity() {
                return out;
            }
        }
    }

    pub fn decode(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let mut plain = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            plain.reserve(256);
            let (before_in, before_out) = (self.decompress.total_in(), self.decompress.total_out());
            let result = self
                .decompress
                .decompress_vec(input, &mut plain, FlushDecompress::Sync);
            input = &input[(self.decompress.total_in() - before_in) as usize..];
            let stalled = self.decompress.total_in() == before_in
                && self.decompress.total_out() == before_out;
            match result {
                Err(e) if e.needs_dictionary().is_some() => self
                    .decompress
                    .set_dictionary(&self.dictionary)
                    .map(|_| ())
                    .map_err(|e| SpdyError::Headers(e.to_string()))?,
                Err(e) => return Err(SpdyError::Headers(e.to_string())),
                Ok(Status::StreamEnd) => break,
                Ok(_) if input.is_empty() && plain.len() < plain.capacity() => break,
                Ok(_) if stalled && plain.len() < plain.capacity() => {
                    return Err(SpdyError::Headers(
                        "the zlib stream does not progress".into(),
                    ));
                }
                Ok(_) => {}
            }
        }
        parse_headers(&plain)
    }
}

fn parse_headers(plain: &[u8]) -> Result<Headers, SpdyError> {
    let mut at = 0usize;
    let mut next = |n: usize| -> Result<&[u8], SpdyError> {
        let s = plain
            .get(at..at + n)
            .ok_or_else(|| SpdyError::Headers("truncated name/value block".into()))?;
        at += n;
        Ok(s)
    };
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = word(next(4)?);
    let mut headers = Vec::new();
    for _ in 0..count {
        let len = word(next(4)?);
        let name = String::from_utf8_lossy(next(len)?).to_ascii_lowercase();
        let len = word(next(4)?);
        let value = String::from_utf8_lossy(next(len)?).into_owned();
        headers.push((name, value));
    }
    Ok(headers)
}

/// The first value of header `name`: several values of one name are NUL-separated in SPDY.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.split('\0').next())
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads one frame; `Ok(None)` at a clean end of the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    codec: &mut HeaderCodec,
) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let flags = head[4];
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    if head[0] & 0x80 == 0 {
        return Ok(Some(Frame::Data {
            stream: be32(&head) & 0x7fff_ffff,
            flags,
            data: body,
        }));
    }
    let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
    if version != VERSION {
        return Err(SpdyError::Version(version));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    let need = match kind {
        SYN_STREAM => 10,
        SYN_REPLY | HEADERS | PING => 4,
        RST_STREAM | GOAWAY => 8,
        _ => 0,
    };
    if body.len() < need {
        return Err(SpdyError::Short(kind));
    }
    let stream = || be32(&body) & 0x7fff_ffff;
    Ok(Some(match kind {
        SYN_STREAM => Frame::SynStream {
            stream: stream(),
            flags,
            headers: codec.decode(&body[10..])?,
        },
        SYN_REPLY => Frame::SynReply {
            stream: stream(),
            flags,
            headers: codec.decode(&body[4..])?,
        },
        HEADERS => {
            // Decoded only to keep the zlib stream in step.
            codec.decode(&body[4..])?;
            Frame::Headers { stream: stream() }
        }
        RST_STREAM => Frame::RstStream {
            stream: stream(),
            status: be32(&body[4..]),
        },
        SETTINGS => Frame::Settings,
        PING => Frame::Ping(be32(&body)),
        GOAWAY => Frame::GoAway {
            last_stream: stream(),
            status: be32(&body[4..]),
        },
        WINDOW_UPDATE => Frame::WindowUpdate,
        other => Frame::Unknown(other),
    }))
}

fn control(kind: u16, flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(body);
    out
}

/// The wire bytes of a frame (header blocks through `codec`, so frames must be encoded in the
/// order they are written).
pub fn encode_frame(frame: &Frame, codec: &mut HeaderCodec) -> Vec<u8> {
    match frame {
        Frame::SynStream {
            stream,
            flags,
            headers,
        } => {
            let mut body = stream.to_be_bytes().to_vec();
            body.extend_from_slice(&[0; 6]);
            body.extend(codec.encode(headers));
            control(SYN_STREAM, *flags, &body)
        }
        Frame::SynReply {
            stream,
            flags,
            headers,
        } => {
            let mut body = stream.to_be_bytes().to_vec();
            body.extend(codec.encode(headers));
            control(SYN_REPLY, *flags, &body)
        }
        Frame::RstStream { stream, status } => {
            let mut body = stream.to_be_bytes().to_vec();
            body.extend_from_slice(&status.to_be_bytes());
            control(RST_STREAM, 0, &body)
        }
        Frame::Settings => control(SETTINGS, 0, &0u32.to_be_bytes()),
        Frame::Ping(id) => control(PING, 0, &id.to_be_bytes()),
        Frame::GoAway {
            last_stream,
            status,
        } => {
            let mut body = last_stream.to_be_bytes().to_vec();
            body.extend_from_slice(&status.to_be_bytes());
            control(GOAWAY, 0, &body)
        }
        Frame::Headers { stream } => {
            let mut body = stream.to_be_bytes().to_vec();
            body.extend(codec.encode(&Vec::new()));
            control(HEADERS, 0, &body)
        }
        Frame::WindowUpdate | Frame::Unknown(_) => Vec::new(),
        Frame::Data {
            stream,
            flags,
            data,
        } => {
            let data = &data[..data.len().min(MAX_FRAME)];
            let mut out = Vec::with_capacity(8 + data.len());
            out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
            out.push(*flags);
            out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
            out.extend_from_slice(data);
            out
        }
    }
}

/// Writes frames from `frames` in order until the channel closes or the peer goes away.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut frames: tokio::sync::mpsc::Receiver<Frame>,
) {
    let mut codec = HeaderCodec::default();
    while let Some(frame) = frames.recv().await {
        let bytes = encode_frame(&frame, &mut codec);
        if w.write_all(&bytes).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_spdy3s_1423_bytes() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"enq=0."));
    }

    #[tokio::test]
    async fn frames_round_trip_with_one_zlib_stream_per_direction() {
        let (mut enc, mut dec) = (HeaderCodec::default(), HeaderCodec::default());
        let frames = [
            Frame::SynStream {
                stream: 1,
                flags: FLAG_FIN,
                headers: vec![
                    ("streamtype".into(), "error".into()),
                    ("port".into(), "8080".into()),
                    ("requestid".into(), "0".into()),
                ],
            },
            Frame::SynStream {
                stream: 3,
                flags: 0,
                headers: vec![
                    ("streamtype".into(), "data".into()),
                    ("port".into(), "8080".into()),
                    ("requestid".into(), "0".into()),
                ],
            },
            Frame::SynReply {
                stream: 3,
                flags: 0,
                headers: vec![],
            },
            Frame::Data {
                stream: 3,
                flags: FLAG_FIN,
                data: b"GET / HTTP/1.1\r\n\r\n".to_vec(),
            },
            Frame::Ping(7),
            Frame::RstStream {
                stream: 5,
                status: REFUSED_STREAM,
            },
            Frame::GoAway {
                last_stream: 3,
                status: 0,
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encode_frame(f, &mut enc));
        }
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(
                read_frame(&mut r, &mut dec)
                    .await
                    .expect("a frame")
                    .as_ref(),
                Some(f)
            );
        }
        assert_eq!(read_frame(&mut r, &mut dec).await.expect("the end"), None);
    }

    #[tokio::test]
    async fn a_header_block_without_the_dictionary_is_an_error_not_a_panic() {
        // A zlib stream compressed without SPDY's dictionary, then garbage.
        let frame = control(SYN_REPLY, 0, &[0, 0, 0, 1, 0x78, 0x9c, 0xff, 0xff]);
        let err = read_frame(&mut &frame[..], &mut HeaderCodec::default())
            .await
            .expect_err("refused");
        assert_eq!(err.metric_label(), "header_block");
        let short = control(RST_STREAM, 0, &[0, 0, 0, 1]);
        let err = read_frame(&mut &short[..], &mut HeaderCodec::default())
            .await
            .expect_err("refused");
        assert_eq!(err.metric_label(), "short_frame");
    }
}
