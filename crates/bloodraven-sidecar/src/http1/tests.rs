//! The small client against scripted servers on loopback (raw TCP, so every framing, hang-up
//! and malformed answer can be produced on purpose), a real axum server, and TLS with a test CA.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const LIMIT: Duration = Duration::from_secs(5);
const MAX_BODY: usize = 1024;

/// What a scripted server does with the n-th request it reads (counted across connections).
#[derive(Clone, Debug)]
enum Reply {
    /// Writes these bytes and keeps the connection.
    Send(Vec<u8>),
    /// Writes these bytes and closes the connection.
    SendThenClose(Vec<u8>),
    /// Closes the connection without answering.
    Close,
    /// Never answers (keeps the connection open).
    Hang,
    /// Reads the request and drops it: no answer, the connection stays open, and later
    /// requests are answered (a proxy that drops pipelined requests).
    Drop,
}

struct Scripted {
    url: Url,
    connections: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    /// How many requests each read on the server side carried, in order.
    batches: Arc<Mutex<Vec<usize>>>,
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    reply: Arc<dyn Fn(usize) -> Reply + Send + Sync>,
    counter: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    batches: Arc<Mutex<Vec<usize>>>,
) {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 8192];
        let n = match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut in_batch = 0;
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let request: Vec<u8> = buf.drain(..end + 4).collect();
            requests
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&request).into_owned());
            in_batch += 1;
            match reply(counter.fetch_add(1, Ordering::SeqCst)) {
                Reply::Send(b) => {
                    if s.write_all(&b).await.is_err() {
                        return;
                    }
                }
                Reply::SendThenClose(b) => {
                    let _ = s.write_all(&b).await;
                    let _ = s.shutdown().await;
                    batches.lock().unwrap().push(in_batch);
                    return;
                }
                Reply::Close => {
                    batches.lock().unwrap().push(in_batch);
                    return;
                }
                Reply::Hang => {
                    std::future::pending::<()>().await;
                }
                Reply::Drop => {}
            }
        }
        if in_batch > 0 {
            batches.lock().unwrap().push(in_batch);
        }
    }
}

async fn scripted(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let batches = Arc::new(Mutex::new(Vec::new()));
    let reply: Arc<dyn Fn(usize) -> Reply + Send + Sync> = Arc::new(reply);
    let counter = Arc::new(AtomicUsize::new(0));
    {
        let (connections, requests, batches) =
            (connections.clone(), requests.clone(), batches.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_connection(
                    s,
                    reply.clone(),
                    counter.clone(),
                    requests.clone(),
                    batches.clone(),
                ));
            }
        });
    }
    Scripted {
        url: Url::parse(&format!("http://{addr}/base")).unwrap(),
        connections,
        requests,
        batches,
    }
}

/// `then` for request `n`, `otherwise` for every other.
fn except(n: usize, then: Reply, otherwise: Reply) -> impl Fn(usize) -> Reply + Send + Sync {
    move |i| {
        if i == n {
            then.clone()
        } else {
            otherwise.clone()
        }
    }
}

fn client(url: &Url) -> Client {
    Client::new(url, None, LIMIT, MAX_BODY).unwrap()
}

/// Asks `s` the same question twice: both answers are `want`, over `connections` connections.
async fn asked_twice(s: &Scripted, want: &str, connections: usize) {
    let c = client(&s.url);
    let r = c.request("/");
    assert_eq!(body(&c.get(&r, LIMIT).await), want);
    assert_eq!(body(&c.get(&r, LIMIT).await), want);
    assert_eq!(s.connections.load(Ordering::SeqCst), connections);
}

fn body(r: &Result<Answer, HttpError>) -> &str {
    std::str::from_utf8(&r.as_ref().expect("an answer").body).unwrap()
}

#[tokio::test]
async fn every_framing_is_read_and_the_connection_kept_where_it_may_be() {
    let answers: Vec<Vec<u8>> = vec![
        ok("length"),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nchu\r\n4\r\nnked\r\n0\r\nX-Trailer: t\r\n\r\n".to_vec(),
        b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\ninterim".to_vec(),
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    ];
    let script = answers.clone();
    let s = scripted(move |n| Reply::Send(script[n % script.len()].clone())).await;
    let c = client(&s.url);
    let r = c.request("/x?a=1");
    let mut got = Vec::new();
    for _ in &answers {
        got.push(c.get(&r, LIMIT).await);
    }
    assert_eq!(body(&got[0]), "length");
    assert_eq!(body(&got[1]), "chunked");
    assert_eq!(got[2].as_ref().unwrap().status, 204);
    assert_eq!(body(&got[2]), "");
    assert_eq!(body(&got[3]), "interim");
    assert_eq!(body(&got[4]), "ok");
    assert_eq!(
        s.connections.load(Ordering::SeqCst),
        1,
        "one kept-alive connection for all"
    );
    let first = s.requests.lock().unwrap()[0].clone();
    assert!(first.starts_with("GET /x?a=1 HTTP/1.1\r\n"), "{first}");
    assert!(
        first.contains(&format!("\r\nHost: {}\r\n", c.party())),
        "{first}"
    );
}

#[tokio::test]
async fn answers_that_end_with_the_connection_are_read_to_the_end_and_not_reused() {
    let s = scripted(|_| {
        Reply::SendThenClose(
            b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end".to_vec(),
        )
    })
    .await;
    asked_twice(&s, "to the end", 2).await;
}

#[tokio::test]
async fn a_pipelined_pair_goes_in_one_write_and_is_answered_in_order() {
    let s = scripted(|n| Reply::Send(ok(&format!("answer {n}")))).await;
    let c = client(&s.url);
    let (a, b) = (c.request("/a"), c.request("/b"));
    for round in 0..3 {
        let got = c.get_all(&[&a, &b], LIMIT).await;
        assert_eq!(body(&got[0]), format!("answer {}", 2 * round));
        assert_eq!(body(&got[1]), format!("answer {}", 2 * round + 1));
    }
    assert_eq!(s.connections.load(Ordering::SeqCst), 1);
    let requests = s.requests.lock().unwrap().clone();
    assert!(requests[0].starts_with("GET /a ") && requests[1].starts_with("GET /b "));
    // Loopback delivers one small write in one piece: the server read both at once.
    assert!(
        s.batches.lock().unwrap().iter().all(|&b| b == 2),
        "{:?}",
        s.batches.lock().unwrap()
    );
}

#[tokio::test]
async fn a_party_that_drops_pipelined_questions_is_asked_one_at_a_time_from_then_on() {
    // The second question of the first pair is read and dropped, as some proxies do.
    let s = scripted(except(1, Reply::Drop, Reply::Send(ok("answered")))).await;
    let c = client(&s.url);
    let (a, b) = (c.request("/a"), c.request("/b"));
    let limit = Duration::from_millis(300);
    let got = c.get_all(&[&a, &b], limit).await;
    assert_eq!(body(&got[0]), "answered");
    assert_eq!(got[1], Err(HttpError::TimedOut(limit)));
    for _ in 0..2 {
        let got = c.get_all(&[&a, &b], LIMIT).await;
        assert_eq!(body(&got[0]), "answered");
        assert_eq!(body(&got[1]), "answered");
    }
    // The first batch held both questions; every later one held one.
    assert_eq!(*s.batches.lock().unwrap(), vec![2, 1, 1, 1, 1]);
    assert_eq!(s.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_party_that_closes_after_each_answer_gets_the_rest_of_a_pair_again() {
    let s = scripted(|n| Reply::SendThenClose(ok(&format!("answer {n}")))).await;
    let c = client(&s.url);
    let (a, b) = (c.request("/a"), c.request("/b"));
    let got = c.get_all(&[&a, &b], LIMIT).await;
    assert_eq!(body(&got[0]), "answer 0");
    assert_eq!(body(&got[1]), "answer 1");
    assert_eq!(s.connections.load(Ordering::SeqCst), 2);
    let requests = s.requests.lock().unwrap().clone();
    assert!(
        requests[1].starts_with("GET /b "),
        "the unanswered request was sent again: {requests:?}"
    );
}

#[tokio::test]
async fn a_kept_alive_connection_the_party_closed_is_replaced_once() {
    // The second request finds its kept-alive connection closed by the party (it restarted):
    // it is sent again on a new one.
    let s = scripted(except(1, Reply::Close, Reply::Send(ok("fresh")))).await;
    asked_twice(&s, "fresh", 2).await;
}

#[tokio::test]
async fn a_party_that_hangs_up_on_every_new_connection_is_an_error_not_a_loop() {
    let s = scripted(|_| Reply::Close).await;
    let c = client(&s.url);
    let (a, b) = (c.request("/a"), c.request("/b"));
    let got = c.get_all(&[&a, &b], LIMIT).await;
    for g in &got {
        assert!(matches!(g, Err(HttpError::Closed { .. })), "{g:?}");
    }
    assert_eq!(s.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_silent_party_times_out_and_its_connection_is_not_reused() {
    let s = scripted(except(0, Reply::Hang, Reply::Send(ok("late")))).await;
    let c = client(&s.url);
    let (a, b) = (c.request("/a"), c.request("/b"));
    let limit = Duration::from_millis(200);
    let got = c.get_all(&[&a, &b], limit).await;
    assert_eq!(got, vec![Err(HttpError::TimedOut(limit)); 2]);
    assert_eq!(body(&c.get(&a, LIMIT).await), "late");
    assert_eq!(s.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bodies_past_the_limit_and_malformed_answers_are_refused() {
    let big = "x".repeat(MAX_BODY + 1);
    let chunked_big = format!(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
        big.len()
    );
    let huge_head = format!(
        "HTTP/1.1 200 OK\r\nX-Long: {}\r\n",
        "h".repeat(MAX_HEAD_BYTES)
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (ok(&big), "too large"),
        (chunked_big.into_bytes(), "too large"),
        (b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(), "malformed"),
        (huge_head.into_bytes(), "malformed"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            "malformed",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n".to_vec(),
            "malformed",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            "malformed",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n".to_vec(),
            "malformed",
        ),
    ];
    for (answer, want) in cases {
        let shown = String::from_utf8_lossy(&answer[..answer.len().min(60)]).into_owned();
        let s = scripted(move |_| Reply::SendThenClose(answer.clone())).await;
        let c = client(&s.url);
        let got = c.get(&c.request("/"), LIMIT).await;
        let matched = match want {
            "too large" => matches!(
                got,
                Err(HttpError::TooLarge {
                    limit: MAX_BODY,
                    ..
                })
            ),
            _ => matches!(got, Err(HttpError::Malformed { .. })),
        };
        assert!(matched, "{shown:?}: {got:?}");
    }
}

#[tokio::test]
async fn arbitrary_bytes_never_panic_and_never_pass_for_more_than_they_are() {
    // A small deterministic generator: answers built from HTTP-ish pieces and noise.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let pieces: [&[u8]; 12] = [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.0 204 X\r\n",
        b"HTTP/1.1 100 C\r\n\r\n",
        b"Content-Length: 3\r\n",
        b"Content-Length: 99999999999999999999\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Connection: close\r\n",
        b"\r\n",
        b"5\r\nhello\r\n",
        b"0\r\n\r\n",
        b"\xff\xfe\x00",
        b"abc",
    ];
    for _ in 0..200 {
        let mut answer = Vec::new();
        #[allow(clippy::cast_possible_truncation)]
        for _ in 0..(next() % 8) {
            answer.extend_from_slice(pieces[(next() % 12) as usize]);
        }
        let shown = answer.clone();
        let s = scripted(move |_| Reply::SendThenClose(answer.clone())).await;
        let c = client(&s.url);
        if let Ok(a) = c.get(&c.request("/"), LIMIT).await {
            assert!(a.body.len() <= MAX_BODY, "{shown:?}");
            // (Empty lines before the status line are allowed, RFC 9112 §2.2.)
            assert!(
                shown.trim_ascii_start().starts_with(b"HTTP/1."),
                "{shown:?} passed for an answer"
            );
        }
    }
}

#[tokio::test]
async fn a_real_server_answers_a_pipelined_pair_on_one_connection() {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/peer/ping", get(|| async { "pong" }))
        .route(
            "/peer/active-site",
            get(|| async { (axum::http::StatusCode::NO_CONTENT, "") }),
        );
    let url = Url::parse(&crate::testing::serve_plain(app).await).unwrap();
    let c = client(&url);
    let (ping, view) = (c.request("/peer/ping"), c.request("/peer/active-site"));
    for _ in 0..3 {
        let got = c.get_all(&[&ping, &view], LIMIT).await;
        assert_eq!(body(&got[0]), "pong");
        assert_eq!(got[1].as_ref().unwrap().status, 204);
    }
}

#[tokio::test]
async fn https_parties_are_checked_against_the_given_roots() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    bloodraven_runtime::tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let pki = bloodraven_runtime::tls::generate_pki(dir.path(), &["127.0.0.1"]).unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.server_cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&pki.server_key).unwrap();
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = Arc::new(AtomicUsize::new(0));
    let reply: Arc<dyn Fn(usize) -> Reply + Send + Sync> =
        Arc::new(|n| Reply::Send(ok(&format!("over tls {n}"))));
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, reply, counter) = (acceptor.clone(), reply.clone(), counter.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    serve_connection(
                        tls,
                        reply,
                        counter,
                        Arc::new(Mutex::new(Vec::new())),
                        Arc::new(Mutex::new(Vec::new())),
                    )
                    .await;
                }
            });
        }
    });
    let url = Url::parse(&format!("https://{addr}")).unwrap();
    let trusting = Arc::new(bloodraven_runtime::tls::client_config(Some(&pki.ca_cert)).unwrap());
    let c = Client::new(&url, Some(TlsSource::Fixed(trusting)), LIMIT, MAX_BODY).unwrap();
    let (a, b) = (c.request("/a"), c.request("/b"));
    let got = c.get_all(&[&a, &b], LIMIT).await;
    assert_eq!(body(&got[0]), "over tls 0");
    assert_eq!(body(&got[1]), "over tls 1");
    assert_eq!(body(&c.get(&a, LIMIT).await), "over tls 2");

    // A client that trusts nothing refuses the same server.
    let nothing = Arc::new(bloodraven_runtime::tls::client_config(None).unwrap());
    let c = Client::new(&url, Some(TlsSource::Fixed(nothing)), LIMIT, MAX_BODY).unwrap();
    let got = c.get(&a, LIMIT).await;
    assert!(matches!(got, Err(HttpError::Tls { .. })), "{got:?}");
    // And https:// without a configuration is refused when the client is made.
    assert!(matches!(
        Client::new(&url, None, LIMIT, MAX_BODY),
        Err(HttpError::NoTls(_))
    ));
}

#[tokio::test]
async fn unreachable_parties_and_bad_urls_are_named() {
    for bad in ["ftp://host/", "unix:/run/x"] {
        let url = Url::parse(bad).unwrap();
        assert!(
            matches!(
                Client::new(&url, None, LIMIT, MAX_BODY),
                Err(HttpError::BadUrl(_))
            ),
            "{bad}"
        );
    }
    // A port nobody listens on (bound, then released).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
    let c = client(&url);
    let got = c.get(&c.request("/"), LIMIT).await;
    match got {
        Err(HttpError::Connect { party, .. }) => assert_eq!(party, format!("127.0.0.1:{port}")),
        other => panic!("{other:?}"),
    }
    let v6 = Url::parse("http://[::1]:8080/x").unwrap();
    assert_eq!(client(&v6).party(), "[::1]:8080");
}
