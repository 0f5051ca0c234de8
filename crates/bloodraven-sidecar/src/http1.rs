//! A small HTTP/1.1 client for the sidecar's own requests: `GET` only, one kept-alive
//! connection per party, and the questions a tick asks one party sent together in one write
//! (pipelined) and answered in order off one buffer.
//!
//! **Why not a general client.** A tick asks the operator and every peer two questions each,
//! every `peerCheckInterval`, next to every MySQL server. A general client's per-request
//! machinery (a connection pool behind a lock, a dispatch task per connection, retry layers, the
//! URL parsed again per request) cost more CPU than the requests themselves, and one write per
//! question costs a trip through the kernel's loopback or network path each. Here a request is
//! bytes rendered once, and a party's questions share one write (docs/benchmarks.md, "The
//! sidecar").
//!
//! **What it speaks.** HTTP/1.1 over TCP, or over TLS for `https://` parties (rustls, the
//! configuration its owner gives: fixed, or a component's mutual TLS that follows reloads of
//! its certificate and CA bundle, in which case a kept-alive connection made under an older
//! one is not reused). Answers framed by `Content-Length`, `Transfer-Encoding:
//! chunked` or the end of the connection; `Connection: close` honoured (HTTP/1.0 answers keep
//! the connection only with `Connection: keep-alive`); interim `1xx` answers skipped; the head
//! bounded by [`MAX_HEAD_BYTES`] and the body by the caller's limit. It never follows a
//! redirect, never uses a proxy and never sends a body.
//!
//! **Pipelining.** HTTP/1.1 lets a client send questions without waiting for each answer,
//! and the operator and the sidecars (hyper) answer them in order. Some proxies answer only
//! the first of such a batch and drop the rest; a party whose batch was cut short after part
//! of it was answered is asked one question at a time from then on ([`Progress`]).
//!
//! **Retrying.** A `GET` is safe to send again, and these are the only requests it sends.
//! Requests whose answers had not begun when their connection ended are sent again on a new
//! connection: a kept-alive connection the party had already closed (it restarted, or dropped
//! idle connections), or a party that closes after each answer, which leaves the rest of a
//! pipelined batch unanswered. A new connection that ends before answering anything is an
//! error, not a retry, so a party that accepts and hangs up cannot loop the client.
//!
//! **Bounds.** [`Client::get_all`] is bounded as a whole by its `limit`; questions still
//! unanswered then are [`HttpError::TimedOut`]. [`Client::ask_each`] leaves the bound to its
//! caller and hands over each answer as it is read; a new connection is always bounded by the
//! connect timeout. A connection that was cut short (a timeout, an
//! error, a dropped future) is never reused: it is taken out of its slot for the exchange and
//! put back only after every answer on it was read in full.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use url::{Host, Position, Url};

/// The largest answer head (status line and headers) read before giving up on a party.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Headers an answer may carry.
const MAX_HEADERS: usize = 32;
/// How much room each read asks for.
const READ_CHUNK: usize = 4096;

/// Why a request got no usable answer. Messages name the party (`host:port`), never a query.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("{0} is not an http:// or https:// URL with a host")]
    BadUrl(String),
    #[error("https:// to {0} needs a TLS configuration")]
    NoTls(String),
    #[error("cannot connect to {party}: {detail}")]
    Connect { party: String, detail: String },
    #[error("no connection to {party} within {} ms", .limit.as_millis())]
    ConnectTimedOut { party: String, limit: Duration },
    #[error("TLS handshake with {party} failed: {detail}")]
    Tls { party: String, detail: String },
    #[error("connection to {party} failed: {detail}")]
    Io { party: String, detail: String },
    #[error("{party} closed the connection before answering")]
    Closed { party: String },
    #[error("{party} answered something that is not HTTP/1.x: {detail}")]
    Malformed { party: String, detail: String },
    #[error("{party} answered a body larger than {limit} bytes")]
    TooLarge { party: String, limit: usize },
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
}

/// An answer: its status and its whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

/// A `GET` rendered once, sent as is.
#[derive(Clone, Debug)]
pub struct Request {
    bytes: Box<[u8]>,
}

impl Request {
    /// The request's target: the path and query it asks for.
    pub fn target(&self) -> &str {
        std::str::from_utf8(&self.bytes)
            .ok()
            .and_then(|t| t.strip_prefix("GET "))
            .and_then(|t| t.split_once(' '))
            .map_or("", |(target, _)| target)
    }
}

/// Where a client's TLS configuration comes from.
#[derive(Clone, Debug)]
pub enum TlsSource {
    /// One configuration for the client's life.
    Fixed(Arc<rustls::ClientConfig>),
    /// A component's mutual TLS for one expected party, rebuilt when its files change.
    Component(Arc<bloodraven_runtime::mtls::ClientTls>),
}

impl TlsSource {
    /// The configuration for a new connection, and the version it belongs to.
    fn config(&self, party: &str) -> Result<(Arc<rustls::ClientConfig>, u64), HttpError> {
        match self {
            TlsSource::Fixed(c) => Ok((c.clone(), 0)),
            TlsSource::Component(c) => {
                let version = c.tls().material().version;
                c.config()
                    .map(|config| (config, version))
                    .map_err(|e| HttpError::Tls {
                        party: party.to_string(),
                        detail: e.to_string(),
                    })
            }
        }
    }

    /// The version a connection made now would have (without looking at the files).
    fn version(&self) -> u64 {
        match self {
            TlsSource::Fixed(_) => 0,
            TlsSource::Component(c) => c.tls().material().version,
        }
    }
}

/// Where a client connects.
#[derive(Clone, Debug)]
enum Target {
    Addr(SocketAddr),
    Name(String, u16),
}

/// One party's client: its address, how to speak TLS to it, and its kept-alive connection.
pub struct Client {
    /// `host:port`, for messages and the `Host` header.
    party: String,
    target: Target,
    tls: Option<(TlsSource, ServerName<'static>)>,
    connect_timeout: Duration,
    max_body: usize,
    idle: Mutex<Option<Conn>>,
    /// Whether the party answers pipelined questions (see [`Progress`]).
    pipelines: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("party", &self.party)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for the party at `url`'s scheme, host and port (its path and query are not
    /// used: requests name theirs). `tls` is required for `https://`.
    pub fn new(
        url: &Url,
        tls: Option<TlsSource>,
        connect_timeout: Duration,
        max_body: usize,
    ) -> Result<Client, HttpError> {
        let bad = || HttpError::BadUrl(url[..Position::AfterPort].to_string());
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(bad()),
        };
        let port = url.port_or_known_default().ok_or_else(bad)?;
        let (target, name) = match url.host().ok_or_else(bad)? {
            Host::Ipv4(a) => (
                Target::Addr(SocketAddr::new(IpAddr::V4(a), port)),
                ServerName::IpAddress(IpAddr::V4(a).into()),
            ),
            Host::Ipv6(a) => (
                Target::Addr(SocketAddr::new(IpAddr::V6(a), port)),
                ServerName::IpAddress(IpAddr::V6(a).into()),
            ),
            Host::Domain(d) if !d.is_empty() => (
                Target::Name(d.to_string(), port),
                ServerName::try_from(d.to_string()).map_err(|_| bad())?,
            ),
            Host::Domain(_) => return Err(bad()),
        };
        let party = url[Position::BeforeHost..Position::AfterPort].to_string();
        let tls = match (https, tls) {
            (false, _) => None,
            (true, Some(source)) => Some((source, name)),
            (true, None) => return Err(HttpError::NoTls(party)),
        };
        Ok(Client {
            party,
            target,
            tls,
            connect_timeout,
            max_body,
            idle: Mutex::new(None),
            pipelines: AtomicBool::new(true),
        })
    }

    /// `host:port` of the party.
    pub fn party(&self) -> &str {
        &self.party
    }

    /// `GET path_and_query` (as it stands after the authority in a URL: already
    /// percent-encoded, e.g. `&url[Position::BeforePath..]`).
    pub fn request(&self, path_and_query: &str) -> Request {
        let text = format!(
            "GET {path_and_query} HTTP/1.1\r\nHost: {}\r\nUser-Agent: bloodraven-sidecar/{}\r\nAccept: application/json\r\n\r\n",
            self.party,
            env!("CARGO_PKG_VERSION")
        );
        Request {
            bytes: text.into_bytes().into_boxed_slice(),
        }
    }

    /// Sends `request` and reads its answer, all within `limit`.
    pub async fn get(&self, request: &Request, limit: Duration) -> Result<Answer, HttpError> {
        self.get_all(&[request], limit)
            .await
            .pop()
            .unwrap_or(Err(HttpError::TimedOut(limit)))
    }

    /// Sends `requests` together (one write) and reads their answers in order, all within
    /// `limit`: one result per request, in the same order.
    pub async fn get_all(
        &self,
        requests: &[&Request],
        limit: Duration,
    ) -> Vec<Result<Answer, HttpError>> {
        let mut answers = Vec::with_capacity(requests.len());
        let _ = tokio::time::timeout(limit, self.ask_each(requests, |_, a| answers.push(a))).await;
        answers.resize(requests.len(), Err(HttpError::TimedOut(limit)));
        answers
    }

    /// Sends `requests` together (one write) and hands each answer to `each` (with its
    /// request's index, in order) the moment it is read, with no bound of its own: for a
    /// caller that bounds it and keeps what was answered before it gave up (the tick bounds
    /// every party's round by one deadline, which saves a timer per party). If the caller
    /// gives up, the connection is dropped with the future, never reused.
    pub async fn ask_each(
        &self,
        requests: &[&Request],
        mut each: impl FnMut(usize, Result<Answer, HttpError>) + Send,
    ) {
        let n = requests.len();
        let mut progress = Progress {
            client: self,
            n,
            answered: 0,
            pipelined: false,
        };
        // Every request not yet answered gets `e`.
        let give_up = |each: &mut dyn FnMut(usize, Result<Answer, HttpError>),
                       progress: &mut Progress<'_>,
                       e: &HttpError| {
            for i in progress.answered..n {
                each(i, Err(e.clone()));
            }
            progress.answered = n;
        };
        // Each pass either answers at least one request, or ran on a reused connection (which
        // the next pass does not, unless another exchange put one back meanwhile): bounded.
        let mut passes = 0;
        while progress.answered < n {
            passes += 1;
            let (mut conn, reused) = match self.take_idle() {
                Some(c) => (c, true),
                None => match self.connect().await {
                    Ok(c) => (c, false),
                    Err(e) => return give_up(&mut each, &mut progress, &e),
                },
            };
            let before = progress.answered;
            let (failed, keep) = self
                .on_connection(&mut conn, requests, &mut progress, &mut each)
                .await;
            match failed {
                None if keep && progress.answered == n => self.put_idle(conn),
                None => {}
                Some(Failure::Ended)
                    if (reused || progress.answered > before) && passes <= 2 * n + 1 => {}
                Some(Failure::Ended) => {
                    let closed = HttpError::Closed {
                        party: self.party.clone(),
                    };
                    return give_up(&mut each, &mut progress, &closed);
                }
                Some(Failure::Error(e)) => return give_up(&mut each, &mut progress, &e),
            }
        }
    }

    /// Asks what is still unanswered on `conn`: every question in one write while the party
    /// takes pipelined questions, one at a time otherwise. Returns how it failed, if it did,
    /// and whether the connection may carry more.
    async fn on_connection(
        &self,
        conn: &mut Conn,
        requests: &[&Request],
        progress: &mut Progress<'_>,
        each: &mut (impl FnMut(usize, Result<Answer, HttpError>) + Send),
    ) -> (Option<Failure>, bool) {
        let n = requests.len();
        while progress.answered < n {
            let end = if self.pipelines.load(Ordering::Relaxed) {
                n
            } else {
                progress.answered + 1
            };
            progress.pipelined |= end - progress.answered > 1;
            if let Err(e) = conn.send(&requests[progress.answered..end]).await {
                return (Some(ended_or(&e, &self.party, true)), true);
            }
            while progress.answered < end {
                match conn.read_answer(&self.party, self.max_body).await {
                    Ok((answer, keep_alive)) => {
                        each(progress.answered, Ok(answer));
                        progress.answered += 1;
                        if !keep_alive {
                            return (None, false);
                        }
                    }
                    Err(e) => return (Some(e), true),
                }
            }
        }
        (None, true)
    }

    async fn connect(&self) -> Result<Conn, HttpError> {
        let tcp = self
            .connecting(
                async {
                    match &self.target {
                        Target::Addr(a) => TcpStream::connect(a).await,
                        Target::Name(host, port) => {
                            TcpStream::connect((host.as_str(), *port)).await
                        }
                    }
                },
                |party, detail| HttpError::Connect { party, detail },
            )
            .await?;
        // Questions are small and answered at once: never hold one back for the next.
        let _ = tcp.set_nodelay(true);
        let (stream, version) = match &self.tls {
            None => (Stream::Plain(tcp), 0),
            Some((source, name)) => {
                let (config, version) = source.config(&self.party)?;
                let connector = TlsConnector::from(config);
                let tls = self
                    .connecting(connector.connect(name.clone(), tcp), |party, detail| {
                        HttpError::Tls { party, detail }
                    })
                    .await?;
                (Stream::Tls(Box::new(tls)), version)
            }
        };
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
            start: 0,
            version,
        })
    }

    /// `step` of making a connection, within the connect timeout; its error becomes
    /// `failed(party, detail)`.
    async fn connecting<T>(
        &self,
        step: impl Future<Output = std::io::Result<T>>,
        failed: fn(String, String) -> HttpError,
    ) -> Result<T, HttpError> {
        match tokio::time::timeout(self.connect_timeout, step).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(failed(self.party.clone(), e.to_string())),
            Err(_) => Err(HttpError::ConnectTimedOut {
                party: self.party.clone(),
                limit: self.connect_timeout,
            }),
        }
    }

    fn take_idle(&self) -> Option<Conn> {
        let conn = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        // Made under certificates or a CA bundle that have since changed: a new connection
        // proves the party again under the new ones.
        match &self.tls {
            Some((source, _)) if source.version() != conn.version => None,
            _ => Some(conn),
        }
    }

    fn put_idle(&self, conn: Conn) {
        let mut slot = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() && conn.start == conn.buf.len() {
            *slot = Some(conn);
        }
    }
}

/// How far an exchange got. An exchange its caller gave up on (dropped) after part of a
/// pipelined batch was answered tells of a party, or something between, that answers only the
/// first of pipelined questions (some proxies drop the rest and keep the connection open):
/// from then on that party is asked one question at a time.
struct Progress<'a> {
    client: &'a Client,
    n: usize,
    answered: usize,
    pipelined: bool,
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        if self.pipelined
            && self.answered > 0
            && self.answered < self.n
            && self.client.pipelines.swap(false, Ordering::Relaxed)
        {
            tracing::warn!(
                party = %self.client.party,
                answered = self.answered,
                asked = self.n,
                "the party answered only part of the questions sent together before the deadline; asking it one question at a time from now on"
            );
        }
    }
}

/// How reading or writing on a connection failed.
#[derive(Debug)]
enum Failure {
    /// The connection ended before any byte of the answer being read: nothing was answered
    /// on it from here, so what is pending may be sent again.
    Ended,
    Error(HttpError),
}

impl From<HttpError> for Failure {
    fn from(e: HttpError) -> Self {
        Failure::Error(e)
    }
}

/// An I/O error before any byte of an answer: the connection ended (reset, broken pipe,
/// closed) or something else went wrong.
fn ended_or(e: &std::io::Error, party: &str, nothing_read: bool) -> Failure {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    if nothing_read
        && matches!(
            e.kind(),
            BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof
        )
    {
        Failure::Ended
    } else {
        Failure::Error(HttpError::Io {
            party: party.to_string(),
            detail: e.to_string(),
        })
    }
}

/// How an answer's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

/// What an answer's head says.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    len: usize,
    framing: Framing,
    keep_alive: bool,
}

/// The rule an answer's head breaks.
#[derive(Debug, thiserror::Error)]
enum HeadError {
    #[error("{0}")]
    Syntax(#[from] httparse::Error),
    #[error("no status code")]
    NoStatus,
    #[error("a header value is not text")]
    NotText,
    #[error("Content-Length {0:?} is not a number")]
    LengthNotANumber(String),
    #[error("two different Content-Length headers")]
    TwoLengths,
}

/// Parses an answer head off the front of `buf`: `Ok(None)` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let status = resp.code.ok_or(HeadError::NoStatus)?;
    let mut keep_alive = resp.version == Some(1);
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut other_coding = false;
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| HeadError::NotText)?;
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .trim()
                .parse()
                .map_err(|_| HeadError::LengthNotANumber(value.to_string()))?;
            if length.is_some_and(|l| l != n) {
                return Err(HeadError::TwoLengths);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides (RFC 9112 §6.3): chunked last frames the body.
            let last = value.rsplit(',').next().unwrap_or("").trim();
            chunked = last.eq_ignore_ascii_case("chunked");
            other_coding = !chunked;
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") && resp.version == Some(0) {
                    keep_alive = true;
                }
            }
        }
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else if other_coding {
        Framing::UntilClose
    } else {
        length.map_or(Framing::UntilClose, Framing::Length)
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    Ok(Some(Head {
        status,
        len,
        framing,
        keep_alive,
    }))
}

/// A connection and what was read on it but not yet consumed (`buf[start..]`).
struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    start: usize,
    /// The TLS material version it was made under (0: plain or fixed).
    version: u64,
}

impl Conn {
    fn unread(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Writes every request in one write.
    async fn send(&mut self, requests: &[&Request]) -> std::io::Result<()> {
        if let [one] = requests {
            self.stream.write_all(&one.bytes).await?;
        } else {
            let mut out = Vec::with_capacity(requests.iter().map(|r| r.bytes.len()).sum());
            for r in requests {
                out.extend_from_slice(&r.bytes);
            }
            self.stream.write_all(&out).await?;
        }
        self.stream.flush().await
    }

    /// Reads more bytes: `Ok(0)` at the end of the connection.
    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start >= READ_CHUNK {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(READ_CHUNK);
        self.stream.read_buf(&mut self.buf).await
    }

    /// Reads one answer (skipping interim `1xx` ones): the answer and whether the connection
    /// may carry another.
    async fn read_answer(
        &mut self,
        party: &str,
        max_body: usize,
    ) -> Result<(Answer, bool), Failure> {
        let io = |e: std::io::Error| {
            Failure::Error(HttpError::Io {
                party: party.to_string(),
                detail: e.to_string(),
            })
        };
        let malformed = |detail: String| {
            Failure::Error(HttpError::Malformed {
                party: party.to_string(),
                detail,
            })
        };
        let mut begun = false;
        let head = loop {
            match parse_head(self.unread()).map_err(|e| malformed(e.to_string()))? {
                Some(h) if (100..200).contains(&h.status) => {
                    self.start += h.len;
                    begun = true;
                }
                Some(h) => break h,
                None if self.unread().len() > MAX_HEAD_BYTES => {
                    return Err(malformed(format!(
                        "an answer head larger than {MAX_HEAD_BYTES} bytes"
                    )));
                }
                None => {
                    let nothing_read = !begun && self.unread().is_empty();
                    match self.fill().await {
                        Ok(0) if nothing_read => return Err(Failure::Ended),
                        Ok(0) => return Err(malformed("the connection ended mid-head".into())),
                        Ok(_) => {}
                        Err(e) => return Err(ended_or(&e, party, nothing_read)),
                    }
                }
            }
        };
        self.start += head.len;
        let too_large = || {
            Failure::Error(HttpError::TooLarge {
                party: party.to_string(),
                limit: max_body,
            })
        };
        let body = match head.framing {
            Framing::None => Vec::new(),
            Framing::Length(n) => {
                if n > max_body {
                    return Err(too_large());
                }
                while self.unread().len() < n {
                    if self.fill().await.map_err(io)? == 0 {
                        return Err(malformed("the connection ended mid-body".into()));
                    }
                }
                let body = self.unread()[..n].to_vec();
                self.start += n;
                body
            }
            Framing::UntilClose => {
                while self.fill().await.map_err(io)? != 0 {
                    if self.unread().len() > max_body {
                        return Err(too_large());
                    }
                }
                let body = self.unread().to_vec();
                self.start = self.buf.len();
                body
            }
            Framing::Chunked => self.read_chunked(max_body, &malformed, &too_large).await?,
        };
        Ok((
            Answer {
                status: head.status,
                body,
            },
            head.keep_alive,
        ))
    }

    async fn read_chunked(
        &mut self,
        max_body: usize,
        malformed: &impl Fn(String) -> Failure,
        too_large: &impl Fn() -> Failure,
    ) -> Result<Vec<u8>, Failure> {
        let mut body = Vec::new();
        loop {
            let (size_len, size) = loop {
                match httparse::parse_chunk_size(self.unread()) {
                    Ok(httparse::Status::Complete((n, size))) => break (n, size),
                    Ok(httparse::Status::Partial) => {
                        if self.unread().len() > MAX_HEAD_BYTES {
                            return Err(malformed("a chunk size line too long".into()));
                        }
                        self.more(malformed).await?;
                    }
                    Err(_) => return Err(malformed("a bad chunk size".into())),
                }
            };
            self.start += size_len;
            let size = usize::try_from(size).map_err(|_| too_large())?;
            if size == 0 {
                // Trailers, if any, up to an empty line.
                loop {
                    match self.unread().windows(2).position(|w| w == b"\r\n") {
                        Some(0) => {
                            self.start += 2;
                            return Ok(body);
                        }
                        Some(i) => self.start += i + 2,
                        None if self.unread().len() > MAX_HEAD_BYTES => {
                            return Err(malformed("trailers too long".into()));
                        }
                        None => self.more(malformed).await?,
                    }
                }
            }
            if body.len() + size > max_body {
                return Err(too_large());
            }
            while self.unread().len() < size + 2 {
                self.more(malformed).await?;
            }
            let (data, crlf) = self.unread()[..size + 2].split_at(size);
            if crlf != b"\r\n" {
                return Err(malformed("a chunk not followed by CRLF".into()));
            }
            body.extend_from_slice(data);
            self.start += size + 2;
        }
    }

    /// Reads more bytes mid-answer, where the end of the connection is an error.
    async fn more(&mut self, malformed: &impl Fn(String) -> Failure) -> Result<(), Failure> {
        match self.fill().await {
            Ok(0) => Err(malformed("the connection ended mid-body".into())),
            Ok(_) => Ok(()),
            Err(e) => Err(malformed(format!("reading failed mid-body: {e}"))),
        }
    }
}

/// TCP, or TLS over TCP.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests;
