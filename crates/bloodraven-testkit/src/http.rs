//! HTTP helpers for tests: a request's JSON answer, where any failure is the test's failure.

/// Sends `req` and decodes its answer as JSON; panics when it cannot (reqwest's errors name
/// the URL, never a header).
pub async fn json_of(req: reqwest::RequestBuilder) -> serde_json::Value {
    let resp = req.send().await.unwrap_or_else(|e| panic!("{e}"));
    resp.json()
        .await
        .unwrap_or_else(|e| panic!("the answer is not JSON: {e}"))
}
