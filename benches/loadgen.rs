//! Open-loop load generator for `benches/load.sh` (run by hand, never by CI or `cargo test`).
//!
//! `cargo bench --bench loadgen -- run URL [options]` sends chat completions at a fixed rate and
//! prints one JSON line with the latency distribution. Open loop: every request is spawned at
//! its scheduled time whatever the server does, so a server that falls behind piles up
//! requests in flight and its latency shows it.
//! For every request it records the time to the first body byte (TTFB) and to the last (TTLB).
//!
//! Options:
//! - `--rate R` requests per second (default 100), `--duration S` seconds (default 10, max 120)
//! - `--stream` ask for an SSE stream
//! - `--history N` the first request of each virtual user carries an N-message agent history
//! - `--users V` virtual users (default 0: every request is a new conversation with the same
//!   body; with V > 0 each user continues its own conversation: the reply it got and a new user
//!   message are appended to the history of its next request, as an OpenAI client does)
//! - `--session-header` send `x-session-id: u<v>` (with `--users`); otherwise the proxy finds the
//!   session by auto matching
//! - `--label TEXT` copied into the output
//!
//! `cargo bench --bench loadgen -- hold URL N HOLD_MS` opens N concurrent streams whose upstream
//! holds each one open for HOLD_MS after its first event (mock-upstream's `x-mock-hold-ms`), waits
//! until all N have delivered their first byte, then reads them to the end. Prints how many opened.
//!
//! Only ever point it at 127.0.0.1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Mutex;

const MAX_DURATION_S: f64 = 120.0;
const MAX_IN_FLIGHT: usize = 20_000;

struct Opts {
    url: String,
    rate: f64,
    duration: f64,
    stream: bool,
    history: usize,
    users: usize,
    session_header: bool,
    label: String,
}

#[derive(Clone, Copy)]
struct Sample {
    ttfb: Duration,
    ttlb: Duration,
    ok: bool,
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `cargo bench` passes `--bench`; without a subcommand there is nothing to do.
    match args.first().map(String::as_str) {
        Some("run") => {
            let opts = parse(&args[1..]);
            runtime().block_on(run(opts));
        }
        Some("hold") if args.len() >= 4 => {
            let n: usize = args[2].parse().expect("N");
            let hold: u64 = args[3].parse().expect("HOLD_MS");
            runtime().block_on(hold_streams(args[1].clone(), n, hold));
        }
        _ => eprintln!("loadgen: driven by benches/load.sh (see its header); nothing to do"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts {
        url: args.first().cloned().expect("URL"),
        rate: 100.0,
        duration: 10.0,
        stream: false,
        history: 0,
        users: 0,
        session_header: false,
        label: String::new(),
    };
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().expect("option value");
        match a.as_str() {
            "--rate" => o.rate = val().parse().expect("rate"),
            "--duration" => o.duration = val().parse().expect("duration"),
            "--stream" => o.stream = true,
            "--history" => o.history = val().parse().expect("history"),
            "--users" => o.users = val().parse().expect("users"),
            "--session-header" => o.session_header = true,
            "--label" => o.label = val(),
            other => panic!("unknown option {other}"),
        }
    }
    assert!(o.url.starts_with("http://127.0.0.1"), "local targets only");
    o.duration = o.duration.min(MAX_DURATION_S);
    o
}

/// An agent conversation of `n` messages: system, then rounds of question, tool call, tool
/// result (a few hundred bytes of JSON) and answer. `tag` makes it unique per virtual user.
fn history(n: usize, tag: &str) -> Vec<Value> {
    let mut v =
        vec![json!({"role": "system", "content": format!("You are an operations agent ({tag}).")})];
    let mut r = 0;
    while v.len() < n {
        v.push(json!({"role": "user", "content": format!("Round {r}: check the orders of customer {} please.", r * 7919 % 10007)}));
        v.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{r}"), "type": "function",
            "function": {"name": "query_orders", "arguments": json!({"customer": r * 7919 % 10007, "days": 7}).to_string()}}]}));
        let rows: Vec<Value> = (0..5)
            .map(|i| json!({"id": format!("ord-{r}-{i}"), "total": (r * 31 + i * 17) % 1000, "status": "paid"}))
            .collect();
        v.push(json!({"role": "tool", "tool_call_id": format!("call_{r}"), "content": json!({"orders": rows}).to_string()}));
        v.push(json!({"role": "assistant", "content": format!("Customer {} placed 5 orders, all paid.", r * 7919 % 10007)}));
        r += 1;
    }
    v.truncate(n.saturating_sub(1));
    v.push(json!({"role": "user", "content": "Summarise everything so far."}));
    v
}

/// One virtual user's conversation so far.
struct User {
    messages: Vec<Value>,
    turn: usize,
}

async fn run(o: Opts) {
    let client = reqwest::Client::builder()
        .gzip(false)
        .pool_max_idle_per_host(4096)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    let url = format!("{}/chat/completions", o.url.trim_end_matches('/'));
    let first = |tag: &str| {
        if o.history > 0 {
            history(o.history, tag)
        } else {
            vec![json!({"role": "user", "content": "hi"})]
        }
    };
    let users: Arc<Vec<Mutex<User>>> = Arc::new(
        (0..o.users)
            .map(|v| {
                Mutex::new(User {
                    messages: first(&format!("u{v}-{}", std::process::id())),
                    turn: 0,
                })
            })
            .collect(),
    );
    let shared_body = Arc::new(body(&first("shared"), o.stream));
    let total = (o.rate * o.duration).round() as usize;
    let interval = Duration::from_secs_f64(1.0 / o.rate);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let start = Instant::now() + Duration::from_millis(50);
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut dropped = 0usize;
    for i in 0..total {
        let scheduled = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(scheduled.into()).await;
        if in_flight.load(std::sync::atomic::Ordering::Relaxed) >= MAX_IN_FLIGHT {
            dropped += 1;
            continue;
        }
        in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (client, url, tx, users, shared_body, in_flight) = (
            client.clone(),
            url.clone(),
            tx.clone(),
            users.clone(),
            shared_body.clone(),
            in_flight.clone(),
        );
        let (stream, header) = (o.stream, o.session_header);
        tokio::spawn(async move {
            let sample = if users.is_empty() {
                one(&client, &url, (*shared_body).clone(), None, scheduled)
                    .await
                    .0
            } else {
                let v = i % users.len();
                // Requests of one user follow each other (the reply goes into the next one).
                let mut user = users[v].lock().await;
                let b = body(&user.messages, stream);
                let sid = header.then(|| format!("u{v}-{}", std::process::id()));
                let (sample, reply) = one(&client, &url, b, sid, scheduled).await;
                let reply = reply.unwrap_or_else(|| json!({"role": "assistant", "content": ""}));
                user.turn += 1;
                let turn = user.turn;
                user.messages.push(reply);
                user.messages
                    .push(json!({"role": "user", "content": format!("Next step {turn}.")}));
                sample
            };
            let _ = tx.send(sample);
            in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
    drop(tx);
    let mut samples = Vec::with_capacity(total);
    while let Some(s) = rx.recv().await {
        samples.push(s);
    }
    let elapsed = start.elapsed().as_secs_f64();
    report(&o, &samples, dropped, elapsed);
}

fn body(messages: &[Value], stream: bool) -> bytes::Bytes {
    let mut b = json!({"model": "gpt-4o-mini", "messages": messages});
    if stream {
        b["stream"] = json!(true);
    }
    bytes::Bytes::from(serde_json::to_vec(&b).expect("json"))
}

/// Sends one request; returns the timings and, for a whole answer, the reply message.
async fn one(
    client: &reqwest::Client,
    url: &str,
    body: bytes::Bytes,
    session: Option<String>,
    scheduled: Instant,
) -> (Sample, Option<Value>) {
    // Sends leave on schedule whatever the server does (each request is its own task), so the
    // clock starts at the send; tokio's 1 ms timer would otherwise add up to 1 ms to every
    // figure. A generator that falls behind shows as `elapsed_s` above `duration_s`.
    let scheduled = scheduled.max(Instant::now());
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .timeout(Duration::from_secs(30))
        .body(body);
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let failed = |at: Instant| Sample {
        ttfb: at - scheduled,
        ttlb: at - scheduled,
        ok: false,
    };
    let resp = match req.send().await {
        Ok(r) => r,
        Err(_) => return (failed(Instant::now()), None),
    };
    let status_ok = resp.status().is_success();
    let is_sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut stream = resp.bytes_stream();
    let mut ttfb = None;
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                ttfb.get_or_insert_with(|| Instant::now() - scheduled);
                buf.extend_from_slice(&c);
            }
            Err(_) => return (failed(Instant::now()), None),
        }
    }
    let ttlb = Instant::now() - scheduled;
    let reply = if is_sse {
        sse_reply(&buf)
    } else {
        serde_json::from_slice::<Value>(&buf)
            .ok()
            .and_then(|v| v.pointer("/choices/0/message").cloned())
    };
    (
        Sample {
            ttfb: ttfb.unwrap_or(ttlb),
            ttlb,
            ok: status_ok,
        },
        reply,
    )
}

/// The assistant message rebuilt from chat SSE deltas (content only; enough for mock-upstream).
fn sse_reply(buf: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(buf).ok()?;
    let mut content = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if let Ok(v) = serde_json::from_str::<Value>(data)
            && let Some(c) = v
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        {
            content.push_str(c);
        }
    }
    Some(json!({"role": "assistant", "content": content}))
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn dist(mut d: Vec<Duration>) -> Value {
    d.sort();
    json!({"p50": pct(&d, 50.0), "p90": pct(&d, 90.0), "p99": pct(&d, 99.0), "max": pct(&d, 100.0)})
}

fn report(o: &Opts, samples: &[Sample], dropped: usize, elapsed: f64) {
    let errors = samples.iter().filter(|s| !s.ok).count() + dropped;
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let out = json!({
        "label": o.label,
        "rate": o.rate,
        "duration_s": o.duration,
        "elapsed_s": elapsed,
        "sent": samples.len() + dropped,
        "ok": ok.len(),
        "errors": errors,
        "error_pct": 100.0 * errors as f64 / (samples.len() + dropped).max(1) as f64,
        "ttfb_ms": dist(ok.iter().map(|s| s.ttfb).collect()),
        "ttlb_ms": dist(ok.iter().map(|s| s.ttlb).collect()),
    });
    println!("{out}");
}

async fn hold_streams(base: String, n: usize, hold_ms: u64) {
    assert!(base.starts_with("http://127.0.0.1"), "local targets only");
    let client = reqwest::Client::builder()
        .gzip(false)
        .pool_max_idle_per_host(n)
        .build()
        .expect("client");
    let url = format!("{}/chat/completions", base.trim_end_matches('/'));
    let opened = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (client, url, opened) = (client.clone(), url.clone(), opened.clone());
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": "gpt-4o-mini", "stream": true,
                "messages": [{"role": "user", "content": format!("stream {i}")}]});
            let resp = client
                .post(&url)
                .header("authorization", "Bearer sk-bench")
                .header("x-mock-hold-ms", hold_ms.to_string())
                .timeout(Duration::from_secs(120))
                .json(&body)
                .send()
                .await;
            let mut first = false;
            let mut ok = false;
            if let Ok(resp) = resp {
                let mut s = resp.bytes_stream();
                while let Some(c) = s.next().await {
                    if c.is_err() {
                        break;
                    }
                    if !first {
                        first = true;
                        opened.wait().await;
                    }
                }
                ok = first;
            }
            if !first {
                opened.wait().await;
            }
            ok
        }));
    }
    let t = Instant::now();
    opened.wait().await;
    let all_open = t.elapsed();
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap_or(false) {
            ok += 1;
        }
    }
    println!(
        "{}",
        json!({"streams": n, "completed": ok, "all_open_after_ms": all_open.as_millis() as u64})
    );
}
