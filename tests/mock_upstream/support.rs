//! Helpers for the mock-upstream tests: a fresh mock with one HTTP client, and an SSE parser.

use std::time::Duration;

use ctxproxy::mock_upstream::{self, MockHandle};
use serde_json::{Value, json};

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().gzip(false).build().unwrap()
}

/// A fresh mock (ids start at 1) and one client for the test; building a client is slow in
/// debug builds, so a test makes one.
pub struct Fx {
    pub mock: MockHandle,
    pub http: reqwest::Client,
}

pub async fn mock() -> Fx {
    Fx {
        mock: mock_upstream::spawn(Duration::ZERO).await,
        http: client(),
    }
}

impl std::ops::Deref for Fx {
    type Target = MockHandle;
    fn deref(&self) -> &MockHandle {
        &self.mock
    }
}

impl Fx {
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base_url()))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    /// The SSE events of a stream as (event name, data); data `[DONE]` becomes a JSON string.
    pub async fn post_stream(&self, path: &str, body: &Value) -> Vec<(Option<String>, Value)> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base_url()))
            .json(body);
        let text = resp.send().await.unwrap().text().await.unwrap();
        parse_sse(&text)
    }
}

pub fn parse_sse(text: &str) -> Vec<(Option<String>, Value)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = Value::Null;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|_| json!(d));
                }
            }
            (name, data)
        })
        .collect()
}

pub fn user(text: &str) -> Value {
    json!({ "role": "user", "content": text })
}
