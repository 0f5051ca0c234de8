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

/// Takes the first complete event off `buf`: its name (`event:`, empty for the default
/// `message`) and its data lines joined; `None` while no event is complete.
pub fn take_named_event(buf: &mut String) -> Option<(String, String)> {
    let end = buf.find("\n\n")?;
    let event: String = buf.drain(..end + 2).collect();
    let name = event
        .lines()
        .find_map(|l| l.strip_prefix("event:"))
        .map(str::trim)
        .unwrap_or_default()
        .to_string();
    let data = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .collect();
    Some((name, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_off_the_buffer_with_their_names() {
        let mut buf = String::from(
            "data: {\"a\":1}\n\n: keep-alive\n\nevent: end\ndata: {\"reason\":\"NotLeader\"}\n\npartial",
        );
        assert_eq!(
            take_named_event(&mut buf),
            Some((String::new(), "{\"a\":1}".into()))
        );
        assert_eq!(
            take_named_event(&mut buf),
            Some((String::new(), String::new()))
        );
        assert_eq!(
            take_named_event(&mut buf),
            Some(("end".into(), "{\"reason\":\"NotLeader\"}".into()))
        );
        assert_eq!(take_named_event(&mut buf), None);
        assert_eq!(buf, "partial");
    }
}
