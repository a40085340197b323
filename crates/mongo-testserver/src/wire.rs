//! MongoDB wire protocol framing: OP_MSG (opcode 2013) in both directions, OP_QUERY (2004) in and
//! OP_REPLY (1) out for the legacy handshake.
//!
//! Any malformed frame is a [`WireError`]; the connection that sent it is closed and no other
//! connection is affected. A well-formed message that nests deeper than MongoDB accepts is
//! [`WireError::TooDeep`]: the connection answers it with an error and stays open.

use bson::{Document, RawDocument};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest message the server accepts, as mongod's `maxMessageSizeBytes`.
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;
/// Largest user document (`maxBsonObjectSize`).
pub const MAX_BSON_OBJECT_SIZE: usize = 16 * 1024 * 1024;
/// Largest command document mongod parses (user maximum plus 16 KiB of command overhead).
pub const MAX_INTERNAL_BSON_SIZE: usize = MAX_BSON_OBJECT_SIZE + 16 * 1024;
/// Deepest nesting of documents and arrays accepted in a message, the message's own document
/// being level 1 (mongod's `maxBSONDepth`). Deeper messages are answered with `Overflow` (15)
/// without being decoded, which keeps every recursive walk of a document far from the stack
/// limit.
pub const MAX_NESTING_DEPTH: usize = crate::limits::MAX_BSON_DEPTH;

const OP_REPLY: i32 = 1;
const OP_QUERY: i32 = 2004;
const OP_MSG: i32 = 2013;
const HEADER_LEN: usize = 16;

/// OP_MSG flag: a CRC-32C checksum follows the sections.
pub const FLAG_CHECKSUM_PRESENT: u32 = 1;
/// OP_MSG flag: the sender will not wait for a reply.
pub const FLAG_MORE_TO_COME: u32 = 1 << 1;
/// OP_MSG flag: the client accepts exhaust replies.
pub const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;

/// Why a frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The frame is not a valid message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A well-framed message nests documents deeper than [`MAX_NESTING_DEPTH`]; it must be
    /// answered with an error (unless `moreToCome` is set) and the connection stays open.
    #[error("BSONObj exceeds maximum nested object depth")]
    TooDeep {
        /// The client's requestID.
        request_id: i32,
        /// The OP_MSG flag bits (0 for OP_QUERY).
        flags: u32,
        /// Whether the message was an OP_QUERY (answered with OP_REPLY).
        op_query: bool,
    },
}

fn malformed(msg: impl Into<String>) -> WireError {
    WireError::Malformed(msg.into())
}

/// One request read from a client.
#[derive(Debug)]
pub enum Request {
    /// An OP_MSG.
    Msg(MsgRequest),
    /// A legacy OP_QUERY (only the handshake is served through it).
    Query(QueryRequest),
}

/// A parsed OP_MSG.
#[derive(Debug)]
pub struct MsgRequest {
    /// The client's requestID (our reply's responseTo).
    pub request_id: i32,
    /// The flag bits.
    pub flags: u32,
    /// The body (kind 0 section).
    pub body: Document,
    /// Document sequences (kind 1 sections): identifier and documents.
    pub sequences: Vec<(String, Vec<Document>)>,
    /// An upper bound on the nesting depth of the request: of the body, and of each sequence
    /// document plus the 2 levels it takes once inserted into the body as an array. Counts
    /// empty documents and arrays (so it is never below the depth the server's nesting limits
    /// measure); `usize::MAX` when a document was decoded by the bson crate.
    pub depth_bound: usize,
}

impl MsgRequest {
    /// Whether the message carried a checksum.
    pub fn has_checksum(&self) -> bool {
        self.flags & FLAG_CHECKSUM_PRESENT != 0
    }

    /// Whether the client expects no reply.
    pub fn more_to_come(&self) -> bool {
        self.flags & FLAG_MORE_TO_COME != 0
    }
}

/// A parsed OP_QUERY.
#[derive(Debug)]
pub struct QueryRequest {
    /// The client's requestID.
    pub request_id: i32,
    /// `db.collection` the query targets, e.g. `admin.$cmd`.
    pub full_collection_name: String,
    /// The query document (the command, possibly wrapped in `$query`).
    pub query: Document,
}

/// Reads one message. `Ok(None)` means the peer closed the connection cleanly between messages.
pub async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<Request>, WireError> {
    let mut len_bytes = [0u8; 4];
    // Read the first byte separately to tell a clean close from a truncated frame.
    match reader.read(&mut len_bytes[..1]).await? {
        0 => return Ok(None),
        _ => reader.read_exact(&mut len_bytes[1..]).await?,
    };
    let len = i32::from_le_bytes(len_bytes);
    if len < HEADER_LEN as i32 || len as usize > MAX_MESSAGE_SIZE {
        return Err(malformed(format!("invalid message length {len}")));
    }
    let len = len as usize;
    buf.clear();
    buf.resize(len, 0);
    buf[..4].copy_from_slice(&len_bytes);
    reader.read_exact(&mut buf[4..]).await?;
    parse_request(buf).map(Some)
}

fn read_i32(bytes: &[u8], at: usize) -> Result<i32, WireError> {
    bytes
        .get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(i32::from_le_bytes)
        .ok_or_else(|| malformed("truncated integer"))
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, WireError> {
    read_i32(bytes, at).map(|v| v as u32)
}

fn read_cstring(bytes: &[u8], at: usize) -> Result<(String, usize), WireError> {
    let rest = bytes
        .get(at..)
        .ok_or_else(|| malformed("truncated string"))?;
    let nul = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| malformed("unterminated string"))?;
    let s = std::str::from_utf8(&rest[..nul])
        .map_err(|_| malformed("string is not UTF-8"))?
        .to_owned();
    Ok((s, at + nul + 1))
}

/// Parses one BSON document starting at `at`; returns it and the offset after it.
fn read_document(bytes: &[u8], at: usize, limit: usize) -> Result<(Document, usize), WireError> {
    read_document_depth(bytes, at, limit).map(|(d, end, _)| (d, end))
}

/// [`read_document`], and an upper bound on the document's nesting depth (see
/// [`MsgRequest::depth_bound`]).
fn read_document_depth(
    bytes: &[u8],
    at: usize,
    limit: usize,
) -> Result<(Document, usize, usize), WireError> {
    let len = read_i32(bytes, at)?;
    if len < 5 || len as usize > limit {
        return Err(malformed(format!("invalid BSON document length {len}")));
    }
    let end = at + len as usize;
    let slice = bytes
        .get(at..end)
        .ok_or_else(|| malformed("BSON document overruns the message"))?;
    let raw =
        RawDocument::from_bytes(slice).map_err(|e| malformed(format!("invalid BSON: {e}")))?;
    // The fast decoder refuses nesting deeper than MAX_NESTING_DEPTH (among everything else
    // it does not handle); the slow path then says why.
    if let Some((doc, depth)) = fast::parse_document(slice) {
        return Ok((doc, end, depth));
    }
    // Each nesting level takes at least 7 bytes: smaller documents cannot be too deep.
    if slice.len() >= 7 * MAX_NESTING_DEPTH {
        check_depth(raw)?;
    }
    // Unusual types or invalid input: the bson crate decides (and explains the error).
    let doc = Document::try_from(raw).map_err(|e| malformed(format!("invalid BSON: {e}")))?;
    Ok((doc, end, usize::MAX))
}

/// A direct BSON decoder for the common element types (the bson crate's generic decoder is a
/// large share of a command's cost). It returns `None` for anything it does not handle or that
/// is malformed; the caller then falls back to the bson crate.
mod fast {
    use bson::{oid::ObjectId, spec::BinarySubtype, Binary, Bson, DateTime, Document, Timestamp};

    struct Reader<'a> {
        bytes: &'a [u8],
        pos: usize,
        /// Nesting level of the document or array being read (the top level is 1).
        depth: usize,
        /// The deepest level read so far.
        max_depth: usize,
    }

    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            let end = self.pos.checked_add(n)?;
            let s = self.bytes.get(self.pos..end)?;
            self.pos = end;
            Some(s)
        }
        fn u8(&mut self) -> Option<u8> {
            self.take(1).map(|b| b[0])
        }
        fn i32(&mut self) -> Option<i32> {
            self.take(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        fn u32(&mut self) -> Option<u32> {
            self.i32().map(|v| v as u32)
        }
        fn i64(&mut self) -> Option<i64> {
            self.take(8)
                .and_then(|b| b.try_into().ok())
                .map(i64::from_le_bytes)
        }
        fn cstr(&mut self) -> Option<&'a str> {
            let rest = self.bytes.get(self.pos..)?;
            let nul = rest.iter().position(|&b| b == 0)?;
            let s = std::str::from_utf8(&rest[..nul]).ok()?;
            self.pos += nul + 1;
            Some(s)
        }
        fn string(&mut self) -> Option<String> {
            let len = self.i32()?;
            if len < 1 {
                return None;
            }
            let raw = self.take(len as usize)?;
            let (body, nul) = raw.split_at(raw.len() - 1);
            if nul != [0] {
                return None;
            }
            std::str::from_utf8(body).ok().map(str::to_owned)
        }
    }

    /// Parses a whole document (the slice must be exactly one document); returns it with its
    /// nesting depth (the document being level 1; empty documents and arrays count).
    pub fn parse_document(bytes: &[u8]) -> Option<(Document, usize)> {
        let mut r = Reader {
            bytes,
            pos: 0,
            depth: 0,
            max_depth: 0,
        };
        let d = document(&mut r)?;
        (r.pos == bytes.len()).then_some((d, r.max_depth))
    }

    fn document(r: &mut Reader<'_>) -> Option<Document> {
        let mut doc = Document::new();
        // Duplicate keys: let the bson crate decide.
        elements(r, |key, v| doc.insert(key, v).is_none().then_some(()))?;
        Some(doc)
    }

    fn array(r: &mut Reader<'_>) -> Option<Vec<Bson>> {
        let mut out = Vec::new();
        elements(r, |_, v| {
            out.push(v);
            Some(())
        })?;
        Some(out)
    }

    /// Reads a length-prefixed list of elements (a document's or an array's), giving each key
    /// and value to `each`; `None` when the bytes are malformed or `each` refuses an element.
    fn elements(r: &mut Reader<'_>, mut each: impl FnMut(&str, Bson) -> Option<()>) -> Option<()> {
        if r.depth >= super::MAX_NESTING_DEPTH {
            // Too deep: the caller's slow path reports it.
            return None;
        }
        r.depth += 1;
        r.max_depth = r.max_depth.max(r.depth);
        let start = r.pos;
        let len = r.i32()?;
        if len < 5 {
            return None;
        }
        let end = start.checked_add(len as usize)?;
        if end > r.bytes.len() || r.bytes[end - 1] != 0 {
            return None;
        }
        loop {
            let tag = r.u8()?;
            if tag == 0 {
                break;
            }
            let key = r.cstr()?;
            let v = value(r, tag)?;
            each(key, v)?;
            if r.pos >= end {
                return None;
            }
        }
        r.depth -= 1;
        (r.pos == end).then_some(())
    }

    fn value(r: &mut Reader<'_>, tag: u8) -> Option<Bson> {
        Some(match tag {
            0x01 => Bson::Double(f64::from_bits(r.i64()? as u64)),
            0x02 => Bson::String(r.string()?),
            0x03 => Bson::Document(document(r)?),
            0x04 => Bson::Array(array(r)?),
            0x05 => {
                let len = r.i32()?;
                if len < 0 {
                    return None;
                }
                let subtype = BinarySubtype::from(r.u8()?);
                if subtype == BinarySubtype::BinaryOld {
                    return None;
                }
                Bson::Binary(Binary {
                    subtype,
                    bytes: r.take(len as usize)?.to_vec(),
                })
            }
            0x07 => {
                let b: [u8; 12] = r.take(12)?.try_into().ok()?;
                Bson::ObjectId(ObjectId::from_bytes(b))
            }
            0x08 => match r.u8()? {
                0 => Bson::Boolean(false),
                1 => Bson::Boolean(true),
                _ => return None,
            },
            0x09 => Bson::DateTime(DateTime::from_millis(r.i64()?)),
            0x0A => Bson::Null,
            0x10 => Bson::Int32(r.i32()?),
            0x11 => {
                let increment = r.u32()?;
                let time = r.u32()?;
                Bson::Timestamp(Timestamp { time, increment })
            }
            0x12 => Bson::Int64(r.i64()?),
            _ => return None,
        })
    }
}

/// Walks a raw document without recursion and refuses nesting deeper than
/// [`MAX_NESTING_DEPTH`] or any element that does not parse.
fn check_depth(raw: &RawDocument) -> Result<(), WireError> {
    use bson::raw::{RawBsonRef, RawIter};
    let invalid = |e: bson::raw::Error| malformed(format!("invalid BSON: {e}"));
    let mut stack: Vec<RawIter<'_>> = vec![raw.iter_elements()];
    while let Some(iter) = stack.last_mut() {
        let Some(element) = iter.next() else {
            stack.pop();
            continue;
        };
        let value = element.and_then(|e| e.value()).map_err(invalid)?;
        let child = match value {
            RawBsonRef::Document(d) => Some(d),
            RawBsonRef::Array(a) => Some(RawDocument::from_bytes(a.as_bytes()).map_err(invalid)?),
            RawBsonRef::JavaScriptCodeWithScope(c) => Some(c.scope),
            _ => None,
        };
        if let Some(child) = child {
            if stack.len() + 1 > MAX_NESTING_DEPTH {
                // parse_request fills in the header fields.
                return Err(WireError::TooDeep {
                    request_id: 0,
                    flags: 0,
                    op_query: false,
                });
            }
            stack.push(child.iter_elements());
        }
    }
    Ok(())
}

/// Parses a complete frame (header included).
pub fn parse_request(bytes: &[u8]) -> Result<Request, WireError> {
    let request_id = read_i32(bytes, 4)?;
    let op_code = read_i32(bytes, 12)?;
    let result = match op_code {
        OP_MSG => parse_msg(bytes, request_id).map(Request::Msg),
        OP_QUERY => parse_query(bytes, request_id).map(Request::Query),
        other => Err(malformed(format!("unsupported opcode {other}"))),
    };
    result.map_err(|e| match e {
        WireError::TooDeep { .. } => WireError::TooDeep {
            request_id,
            flags: if op_code == OP_MSG {
                read_u32(bytes, HEADER_LEN).unwrap_or(0)
            } else {
                0
            },
            op_query: op_code == OP_QUERY,
        },
        other => other,
    })
}

fn parse_msg(bytes: &[u8], request_id: i32) -> Result<MsgRequest, WireError> {
    let flags = read_u32(bytes, HEADER_LEN)?;
    // Bits 0-15 are required: unknown ones must make the message fail.
    let known = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME;
    if flags & 0xFFFF & !known != 0 {
        return Err(malformed(format!("unknown required flag bits {flags:#x}")));
    }
    let mut end = bytes.len();
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        if end < HEADER_LEN + 4 + 4 {
            return Err(malformed("message too short for a checksum"));
        }
        end -= 4;
        let expected = read_u32(bytes, end)?;
        let actual = crc32c::crc32c(&bytes[..end]);
        if expected != actual {
            return Err(malformed("checksum mismatch"));
        }
    }
    let bytes = &bytes[..end];
    let mut at = HEADER_LEN + 4;
    let mut body = None;
    let mut sequences = Vec::new();
    let mut depth_bound = 0;
    while at < bytes.len() {
        let kind = bytes[at];
        at += 1;
        match kind {
            0 => {
                if body.is_some() {
                    return Err(malformed("more than one body section"));
                }
                let (doc, next, depth) = read_document_depth(bytes, at, MAX_INTERNAL_BSON_SIZE)?;
                depth_bound = depth_bound.max(depth);
                body = Some(doc);
                at = next;
            }
            1 => {
                let size = read_i32(bytes, at)?;
                if size < 5 {
                    return Err(malformed("invalid document sequence size"));
                }
                let seq_end = at + size as usize;
                if seq_end > bytes.len() {
                    return Err(malformed("document sequence overruns the message"));
                }
                let (identifier, mut pos) = read_cstring(&bytes[..seq_end], at + 4)?;
                let mut docs = Vec::new();
                while pos < seq_end {
                    let (doc, next, depth) =
                        read_document_depth(&bytes[..seq_end], pos, MAX_INTERNAL_BSON_SIZE)?;
                    depth_bound = depth_bound.max(depth.saturating_add(2));
                    docs.push(doc);
                    pos = next;
                }
                sequences.push((identifier, docs));
                at = seq_end;
            }
            other => return Err(malformed(format!("unknown section kind {other}"))),
        }
    }
    let body = body.ok_or_else(|| malformed("OP_MSG without a body section"))?;
    Ok(MsgRequest {
        request_id,
        flags,
        body,
        sequences,
        depth_bound,
    })
}

fn parse_query(bytes: &[u8], request_id: i32) -> Result<QueryRequest, WireError> {
    let _flags = read_i32(bytes, HEADER_LEN)?;
    let (full_collection_name, at) = read_cstring(bytes, HEADER_LEN + 4)?;
    let _skip = read_i32(bytes, at)?;
    let _return = read_i32(bytes, at + 4)?;
    let (query, end) = read_document(bytes, at + 8, MAX_INTERNAL_BSON_SIZE)?;
    if end < bytes.len() {
        // An optional returnFieldsSelector may follow; it must be well-formed too.
        let (_, end2) = read_document(bytes, end, MAX_INTERNAL_BSON_SIZE)?;
        if end2 != bytes.len() {
            return Err(malformed("trailing bytes after OP_QUERY"));
        }
    }
    Ok(QueryRequest {
        request_id,
        full_collection_name,
        query,
    })
}

fn write_header(out: &mut Vec<u8>, request_id: i32, response_to: i32, op_code: i32) {
    out.extend_from_slice(&0i32.to_le_bytes()); // length, patched later
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&response_to.to_le_bytes());
    out.extend_from_slice(&op_code.to_le_bytes());
}

fn patch_length(out: &mut [u8]) {
    let len = out.len() as i32;
    out[..4].copy_from_slice(&len.to_le_bytes());
}

/// Encodes an OP_MSG reply with one body section into `out` (cleared first).
pub fn encode_msg_reply(
    out: &mut Vec<u8>,
    request_id: i32,
    response_to: i32,
    body: &Document,
    checksum: bool,
) -> Result<(), bson::ser::Error> {
    out.clear();
    write_header(out, request_id, response_to, OP_MSG);
    let flags = if checksum { FLAG_CHECKSUM_PRESENT } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.push(0);
    body.to_writer(&mut *out)?;
    if checksum {
        out.extend_from_slice(&[0; 4]);
        patch_length(out);
        let end = out.len() - 4;
        let sum = crc32c::crc32c(&out[..end]);
        out[end..].copy_from_slice(&sum.to_le_bytes());
    } else {
        patch_length(out);
    }
    Ok(())
}

/// Encodes an OP_REPLY carrying one document into `out` (cleared first).
pub fn encode_op_reply(
    out: &mut Vec<u8>,
    request_id: i32,
    response_to: i32,
    doc: &Document,
) -> Result<(), bson::ser::Error> {
    out.clear();
    write_header(out, request_id, response_to, OP_REPLY);
    out.extend_from_slice(&0i32.to_le_bytes()); // responseFlags
    out.extend_from_slice(&0i64.to_le_bytes()); // cursorID
    out.extend_from_slice(&0i32.to_le_bytes()); // startingFrom
    out.extend_from_slice(&1i32.to_le_bytes()); // numberReturned
    doc.to_writer(&mut *out)?;
    patch_length(out);
    Ok(())
}

/// Encodes an OP_MSG request (used by tests and tools that speak the protocol by hand).
pub fn encode_msg_request(request_id: i32, body: &Document) -> Result<Vec<u8>, bson::ser::Error> {
    let mut out = Vec::new();
    write_header(&mut out, request_id, 0, OP_MSG);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    body.to_writer(&mut out)?;
    patch_length(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn msg_round_trip_with_checksum() {
        let mut out = Vec::new();
        encode_msg_reply(&mut out, 7, 3, &doc! {"ping": 1, "$db": "admin"}, true).unwrap();
        let Request::Msg(m) = parse_request(&out).unwrap() else {
            panic!("expected OP_MSG")
        };
        assert_eq!(m.request_id, 7);
        assert!(m.has_checksum());
        assert_eq!(m.body, doc! {"ping": 1, "$db": "admin"});
        // Corrupt one byte: checksum must fail.
        let mut bad = out.clone();
        let n = bad.len() - 6;
        bad[n] ^= 0xFF;
        assert!(parse_request(&bad).is_err());
    }

    #[test]
    fn fast_parser_agrees_with_bson() {
        let d = doc! {
            "a": 1, "b": 2i64, "c": 1.5, "d": "x", "e": {"f": [1, "two", {"g": null}]},
            "h": true, "i": bson::oid::ObjectId::new(), "j": bson::DateTime::from_millis(5),
            "k": bson::Timestamp { time: 3, increment: 4 },
            "l": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16] },
        };
        let bytes = bson::to_vec(&d).unwrap();
        assert_eq!(fast::parse_document(&bytes).map(|(d, _)| d), Some(d));
        // The depth counts every level, empty ones too (never below `limits::shape`'s).
        assert_eq!(
            fast::parse_document(&bytes).map(|(_, depth)| depth),
            Some(4)
        );
        let empty = bson::to_vec(&doc! {"a": {"b": []}}).unwrap();
        assert_eq!(
            fast::parse_document(&empty).map(|(_, depth)| depth),
            Some(3)
        );
        // Unusual types fall back.
        let r = bson::to_vec(&doc! {"r": bson::Regex { pattern: "a".into(), options: "".into() }})
            .unwrap();
        assert_eq!(fast::parse_document(&r), None);
        // Truncations never panic.
        for n in 0..bytes.len() {
            let _ = fast::parse_document(&bytes[..n]);
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut d = doc! {"x": 1};
        for _ in 0..300 {
            d = doc! {"a": d};
        }
        let bytes = encode_msg_request(7, &d).unwrap();
        assert!(matches!(
            parse_request(&bytes),
            Err(WireError::TooDeep {
                request_id: 7,
                op_query: false,
                ..
            })
        ));
        // 200 levels (the message's document included) are accepted.
        let mut d = doc! {"x": 1};
        for _ in 1..MAX_NESTING_DEPTH {
            d = doc! {"a": d};
        }
        let bytes = encode_msg_request(8, &d).unwrap();
        assert!(parse_request(&bytes).is_ok());
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_request(&[0u8; 16]).is_err());
        let mut bytes = encode_msg_request(1, &doc! {"a": 1}).unwrap();
        bytes.truncate(bytes.len() - 2);
        assert!(parse_request(&bytes).is_err());
    }
}
