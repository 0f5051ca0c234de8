//! Server-sent events as a client reads them off a stream (the operator's
//! `/active-site?watch=true`).

/// Takes the first complete event off `buf` (the text received so far) and returns its data
/// lines joined; `None` while no event is complete. An event without data (a comment, a
/// keep-alive) gives an empty string.
pub fn take_event_data(buf: &mut String) -> Option<String> {
    let end = buf.find("\n\n")?;
    let event: String = buf.drain(..end + 2).collect();
    Some(
        event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect(),
    )
}
