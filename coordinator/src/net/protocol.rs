//! PostgreSQL protocol v3 framing: decoding what clients send, encoding what
//! the coordinator says itself, and reading what servers answer.
//!
//! Messages a client sends are decoded only as far as routing needs; the
//! rest of the bytes are kept and forwarded as they came.

use crate::net::sqlstate;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

pub const PROTOCOL_V3: i32 = 196_608;
pub const SSL_REQUEST: i32 = 80_877_103;
pub const GSSENC_REQUEST: i32 = 80_877_104;
pub const CANCEL_REQUEST: i32 = 80_877_102;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("message of {0} bytes is larger than the limit of {1} bytes")]
    TooLarge(usize, usize),
    #[error("invalid message length {0}")]
    BadLength(i32),
    #[error("malformed {0} message")]
    Malformed(&'static str),
    #[error("unsupported protocol version {0}.{1}")]
    UnsupportedVersion(i32, i32),
    #[error("unexpected message type '{0}'")]
    UnexpectedType(char),
    #[error("received unencrypted data after SSL request")]
    UnencryptedAfterSslRequest,
    #[error("SSL request inside a TLS session")]
    SslRequestInsideTls,
}

/// The first message of a connection (untyped: length, then a code).
#[derive(Debug, PartialEq, Eq)]
pub enum StartupRequest {
    Startup { parameters: Vec<(String, String)> },
    Ssl,
    GssEncryption,
    Cancel { process_id: i32, secret_key: i32 },
}

/// A message a client sends after startup. Statement and portal names and
/// texts are decoded; everything else stays in `raw` for forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMessage {
    Query(String),
    Parse {
        name: String,
        query: String,
        parameter_types: Vec<u32>,
    },
    Bind(Bind),
    Describe {
        kind: u8,
        name: String,
    },
    Execute {
        portal: String,
        max_rows: i32,
    },
    Close {
        kind: u8,
        name: String,
    },
    Sync,
    Flush,
    CopyData(Bytes),
    CopyDone,
    CopyFail(String),
    Terminate,
    /// PasswordMessage, SASLInitialResponse and SASLResponse share the tag.
    Password(Bytes),
    /// A fast-path FunctionCall (libpq's large-object functions use it),
    /// forwarded as it came.
    FunctionCall(Bytes),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub portal: String,
    pub statement: String,
    pub parameter_formats: Vec<i16>,
    /// None for NULL.
    pub parameters: Vec<Option<Bytes>>,
    pub result_formats: Vec<i16>,
}

impl Bind {
    /// The format (0 text, 1 binary) of parameter `index`.
    pub fn parameter_format(&self, index: usize) -> i16 {
        match self.parameter_formats.len() {
            0 => 0,
            1 => self.parameter_formats[0],
            _ => self.parameter_formats.get(index).copied().unwrap_or(0),
        }
    }

    pub fn encode(&self, statement: &str, out: &mut BytesMut) {
        let start = begin_message(out, b'B');
        put_cstr(out, &self.portal);
        put_cstr(out, statement);
        out.put_u16(self.parameter_formats.len() as u16);
        for format in &self.parameter_formats {
            out.put_i16(*format);
        }
        out.put_u16(self.parameters.len() as u16);
        for parameter in &self.parameters {
            match parameter {
                None => out.put_i32(-1),
                Some(value) => {
                    out.put_i32(value.len() as i32);
                    out.put_slice(value);
                }
            }
        }
        out.put_u16(self.result_formats.len() as u16);
        for format in &self.result_formats {
            out.put_i16(*format);
        }
        end_message(out, start);
    }
}

/// Splits the first untyped message off `buffer`, if it is complete.
pub fn decode_startup(
    buffer: &mut BytesMut,
    limit: usize,
) -> Result<Option<StartupRequest>, ProtocolError> {
    if buffer.len() < 4 {
        return Ok(None);
    }
    let length = i32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]);
    if length < 8 {
        return Err(ProtocolError::BadLength(length));
    }
    if length as usize > limit.min(MAX_STARTUP_PACKET) {
        return Err(ProtocolError::TooLarge(
            length as usize,
            limit.min(MAX_STARTUP_PACKET),
        ));
    }
    if buffer.len() < length as usize {
        return Ok(None);
    }
    let mut body = buffer.split_to(length as usize).freeze();
    body.advance(4);
    let code = body.get_i32();
    match code {
        SSL_REQUEST => Ok(Some(StartupRequest::Ssl)),
        GSSENC_REQUEST => Ok(Some(StartupRequest::GssEncryption)),
        CANCEL_REQUEST => {
            if body.remaining() != 8 {
                return Err(ProtocolError::Malformed("CancelRequest"));
            }
            Ok(Some(StartupRequest::Cancel {
                process_id: body.get_i32(),
                secret_key: body.get_i32(),
            }))
        }
        PROTOCOL_V3 => {
            let mut parameters = Vec::new();
            loop {
                let name = get_cstr(&mut body, "StartupMessage")?;
                if name.is_empty() {
                    break;
                }
                let value = get_cstr(&mut body, "StartupMessage")?;
                parameters.push((name, value));
            }
            if body.has_remaining() {
                return Err(ProtocolError::Malformed("StartupMessage"));
            }
            Ok(Some(StartupRequest::Startup { parameters }))
        }
        other => Err(ProtocolError::UnsupportedVersion(
            other >> 16,
            other & 0xffff,
        )),
    }
}

/// PostgreSQL's own limit on a startup packet.
const MAX_STARTUP_PACKET: usize = 10_000;

/// The most [`split_message`] reserves ahead for a message still arriving.
const RESERVE_AHEAD: usize = 64 * 1024;

/// Splits one typed message off `buffer`: its tag and body.
pub fn split_message(
    buffer: &mut BytesMut,
    limit: usize,
) -> Result<Option<(u8, Bytes)>, ProtocolError> {
    if buffer.len() < 5 {
        return Ok(None);
    }
    let length = i32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]);
    if length < 4 {
        return Err(ProtocolError::BadLength(length));
    }
    let total = length as usize + 1;
    if total > limit {
        return Err(ProtocolError::TooLarge(total, limit));
    }
    if buffer.len() < total {
        // Room for what is likely to come soon, not for all the length
        // announces: a client that announces a large message and then
        // sends it slowly holds only what it sent.
        buffer.reserve((total - buffer.len()).min(RESERVE_AHEAD));
        return Ok(None);
    }
    let mut message = buffer.split_to(total).freeze();
    let tag = message[0];
    message.advance(5);
    Ok(Some((tag, message)))
}

/// Decodes one client message from `buffer`, if a whole one is there.
/// `utf8_client`: the client's encoding is UTF8 (otherwise non-ASCII text
/// is kept byte for byte, see [`client_text`]).
pub fn decode_frontend(
    buffer: &mut BytesMut,
    limit: usize,
    utf8_client: bool,
) -> Result<Option<FrontendMessage>, ProtocolError> {
    match split_message(buffer, limit)? {
        None => Ok(None),
        Some((tag, body)) => parse_frontend(tag, body, utf8_client).map(Some),
    }
}

/// Decodes the body of a client message with tag `tag`.
pub fn parse_frontend(
    tag: u8,
    mut body: Bytes,
    utf8_client: bool,
) -> Result<FrontendMessage, ProtocolError> {
    let get_cstr = |body: &mut Bytes, name| get_text(body, name, utf8_client);
    let message = match tag {
        b'Q' => FrontendMessage::Query(get_cstr(&mut body, "Query")?),
        b'P' => {
            let name = get_cstr(&mut body, "Parse")?;
            let query = get_cstr(&mut body, "Parse")?;
            let count = get_count(&mut body, "Parse")?;
            let mut parameter_types = Vec::with_capacity(count);
            for _ in 0..count {
                parameter_types.push(get_i32(&mut body, "Parse")? as u32);
            }
            FrontendMessage::Parse {
                name,
                query,
                parameter_types,
            }
        }
        b'B' => FrontendMessage::Bind(parse_bind(&mut body, utf8_client)?),
        b'D' => {
            let kind = get_u8(&mut body, "Describe")?;
            if kind != b'S' && kind != b'P' {
                return Err(ProtocolError::Malformed("Describe"));
            }
            FrontendMessage::Describe {
                kind,
                name: get_cstr(&mut body, "Describe")?,
            }
        }
        b'E' => FrontendMessage::Execute {
            portal: get_cstr(&mut body, "Execute")?,
            max_rows: get_i32(&mut body, "Execute")?,
        },
        b'C' => {
            let kind = get_u8(&mut body, "Close")?;
            if kind != b'S' && kind != b'P' {
                return Err(ProtocolError::Malformed("Close"));
            }
            FrontendMessage::Close {
                kind,
                name: get_cstr(&mut body, "Close")?,
            }
        }
        b'S' => FrontendMessage::Sync,
        b'H' => FrontendMessage::Flush,
        b'd' => return Ok(FrontendMessage::CopyData(body)),
        b'c' => FrontendMessage::CopyDone,
        b'f' => FrontendMessage::CopyFail(get_cstr(&mut body, "CopyFail")?),
        b'X' => FrontendMessage::Terminate,
        b'p' => return Ok(FrontendMessage::Password(body)),
        b'F' => return Ok(FrontendMessage::FunctionCall(body)),
        other => return Err(ProtocolError::UnexpectedType(other as char)),
    };
    if body.has_remaining() {
        return Err(ProtocolError::Malformed(message_name(tag)));
    }
    Ok(message)
}

fn parse_bind(body: &mut Bytes, utf8_client: bool) -> Result<Bind, ProtocolError> {
    const NAME: &str = "Bind";
    let portal = get_text(body, NAME, utf8_client)?;
    let statement = get_text(body, NAME, utf8_client)?;
    let format_count = get_count(body, NAME)?;
    let mut parameter_formats = Vec::with_capacity(format_count);
    for _ in 0..format_count {
        parameter_formats.push(get_i16(body, NAME)?);
    }
    let parameter_count = get_count(body, NAME)?;
    if format_count > 1 && format_count != parameter_count {
        return Err(ProtocolError::Malformed(NAME));
    }
    let mut parameters = Vec::with_capacity(parameter_count);
    for _ in 0..parameter_count {
        let length = get_i32(body, NAME)?;
        if length == -1 {
            parameters.push(None);
        } else if length < 0 || length as usize > body.remaining() {
            return Err(ProtocolError::Malformed(NAME));
        } else {
            parameters.push(Some(body.split_to(length as usize)));
        }
    }
    let result_count = get_count(body, NAME)?;
    let mut result_formats = Vec::with_capacity(result_count);
    for _ in 0..result_count {
        result_formats.push(get_i16(body, NAME)?);
    }
    Ok(Bind {
        portal,
        statement,
        parameter_formats,
        parameters,
        result_formats,
    })
}

fn message_name(tag: u8) -> &'static str {
    match tag {
        b'Q' => "Query",
        b'P' => "Parse",
        b'B' => "Bind",
        b'D' => "Describe",
        b'E' => "Execute",
        b'C' => "Close",
        b'S' => "Sync",
        b'H' => "Flush",
        b'c' => "CopyDone",
        b'f' => "CopyFail",
        b'X' => "Terminate",
        _ => "unknown",
    }
}

fn get_u8(body: &mut Bytes, name: &'static str) -> Result<u8, ProtocolError> {
    if body.remaining() < 1 {
        return Err(ProtocolError::Malformed(name));
    }
    Ok(body.get_u8())
}

/// A count of formats, parameters or types: PostgreSQL reads them as
/// unsigned 16-bit numbers (up to 65,535 parameters).
fn get_count(body: &mut Bytes, name: &'static str) -> Result<usize, ProtocolError> {
    if body.remaining() < 2 {
        return Err(ProtocolError::Malformed(name));
    }
    Ok(usize::from(body.get_u16()))
}

fn get_i16(body: &mut Bytes, name: &'static str) -> Result<i16, ProtocolError> {
    if body.remaining() < 2 {
        return Err(ProtocolError::Malformed(name));
    }
    Ok(body.get_i16())
}

fn get_i32(body: &mut Bytes, name: &'static str) -> Result<i32, ProtocolError> {
    if body.remaining() < 4 {
        return Err(ProtocolError::Malformed(name));
    }
    Ok(body.get_i32())
}

/// A NUL-terminated UTF-8 string.
pub fn get_cstr(body: &mut Bytes, name: &'static str) -> Result<String, ProtocolError> {
    let end = body
        .iter()
        .position(|b| *b == 0)
        .ok_or(ProtocolError::Malformed(name))?;
    let text = std::str::from_utf8(&body[..end])
        .map_err(|_| ProtocolError::Malformed(name))?
        .to_owned();
    body.advance(end + 1);
    Ok(text)
}

/// A NUL-terminated string of client text (see [`client_text`]).
fn get_text(
    body: &mut Bytes,
    name: &'static str,
    utf8_client: bool,
) -> Result<String, ProtocolError> {
    let end = body
        .iter()
        .position(|b| *b == 0)
        .ok_or(ProtocolError::Malformed(name))?;
    let text = client_text(&body[..end], utf8_client);
    body.advance(end + 1);
    Ok(text)
}

// ---- client text ----------------------------------------------------------
//
// Statement texts and names come in the client's encoding, which need not
// be UTF-8 (client_encoding LATIN9, SQL_ASCII, or bytes a UTF8 client got
// wrong, which the server must report). Such text is kept byte for byte:
// each non-ASCII byte becomes one character of a private-use range, and
// [`put_cstr`] writes those characters back as the bytes they were. The
// coordinator never routes a text with such characters (see
// [`has_client_bytes`]): its literals are not what they look like.

/// The first of 128 private-use characters that stand for bytes 0x80-0xFF.
const BYTE_CHARS: u32 = 0xF780;

/// `bytes` as a String: UTF-8 as it is when the client's encoding is
/// UTF8 and the bytes are valid and hold no character of the byte range;
/// otherwise ASCII as it is and each other byte as its stand-in.
pub fn client_text(bytes: &[u8], utf8_client: bool) -> String {
    if bytes.is_ascii() {
        // ASCII is the same in every client encoding.
        return String::from_utf8_lossy(bytes).into_owned();
    }
    if utf8_client {
        if let Ok(text) = std::str::from_utf8(bytes) {
            if !has_client_bytes(text) {
                return text.to_owned();
            }
        }
    }
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii() {
                b as char
            } else {
                char::from_u32(BYTE_CHARS + u32::from(b - 0x80))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            }
        })
        .collect()
}

/// Whether `text` holds stand-ins for client bytes.
pub fn has_client_bytes(text: &str) -> bool {
    // The stand-ins are EF 9E 80 .. EF 9F BF in UTF-8.
    text.as_bytes().contains(&0xEF)
        && text
            .chars()
            .any(|c| (BYTE_CHARS..BYTE_CHARS + 128).contains(&(c as u32)))
}

// ---- encoding -------------------------------------------------------------

/// Writes a tag and a length placeholder; returns where the length goes.
/// The column values of a DataRow message's body (None for NULL); empty
/// when the body is malformed.
pub fn data_row_values(body: &[u8]) -> Vec<Option<&[u8]>> {
    let mut values = Vec::new();
    let Some(count) = body.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
        return values;
    };
    let mut at = 2;
    for _ in 0..count {
        let Some(length) = body
            .get(at..at + 4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return Vec::new();
        };
        at += 4;
        if length < 0 {
            values.push(None);
            continue;
        }
        let Some(value) = body.get(at..at + length as usize) else {
            return Vec::new();
        };
        values.push(Some(value));
        at += length as usize;
    }
    values
}

pub fn begin_message(out: &mut BytesMut, tag: u8) -> usize {
    out.put_u8(tag);
    let at = out.len();
    out.put_i32(0);
    at
}

/// Fills in the length written by [`begin_message`].
pub fn end_message(out: &mut BytesMut, at: usize) {
    let length = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&length.to_be_bytes());
}

/// Writes `text` and a NUL; stand-ins for client bytes go back as the
/// bytes they stand for.
pub fn put_cstr(out: &mut BytesMut, text: &str) {
    if has_client_bytes(text) {
        for c in text.chars() {
            match (c as u32).checked_sub(BYTE_CHARS) {
                Some(byte) if byte < 128 => out.put_u8(0x80 + byte as u8),
                _ => {
                    let mut utf8 = [0u8; 4];
                    out.put_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
    } else {
        out.put_slice(text.as_bytes());
    }
    out.put_u8(0);
}

pub fn query(out: &mut BytesMut, sql: &str) {
    let at = begin_message(out, b'Q');
    put_cstr(out, sql);
    end_message(out, at);
}

pub fn parse(out: &mut BytesMut, name: &str, sql: &str, parameter_types: &[u32]) {
    let at = begin_message(out, b'P');
    put_cstr(out, name);
    put_cstr(out, sql);
    out.put_u16(parameter_types.len() as u16);
    for oid in parameter_types {
        out.put_u32(*oid);
    }
    end_message(out, at);
}

pub fn describe(out: &mut BytesMut, kind: u8, name: &str) {
    let at = begin_message(out, b'D');
    out.put_u8(kind);
    put_cstr(out, name);
    end_message(out, at);
}

pub fn execute(out: &mut BytesMut, portal: &str, max_rows: i32) {
    let at = begin_message(out, b'E');
    put_cstr(out, portal);
    out.put_i32(max_rows);
    end_message(out, at);
}

pub fn close(out: &mut BytesMut, kind: u8, name: &str) {
    let at = begin_message(out, b'C');
    out.put_u8(kind);
    put_cstr(out, name);
    end_message(out, at);
}

pub fn sync(out: &mut BytesMut) {
    out.put_slice(&[b'S', 0, 0, 0, 4]);
}

pub fn flush(out: &mut BytesMut) {
    out.put_slice(&[b'H', 0, 0, 0, 4]);
}

/// A typed message with an empty body (ParseComplete, BindComplete, …).
pub fn empty(out: &mut BytesMut, tag: u8) {
    out.put_slice(&[tag, 0, 0, 0, 4]);
}

/// ParameterDescription: the parameters' type oids.
pub fn parameter_description(out: &mut BytesMut, type_oids: &[u32]) {
    let at = begin_message(out, b't');
    out.put_u16(type_oids.len() as u16);
    for oid in type_oids {
        out.put_u32(*oid);
    }
    end_message(out, at);
}

pub fn ready_for_query(out: &mut BytesMut, status: u8) {
    out.put_slice(&[b'Z', 0, 0, 0, 5, status]);
}

pub fn command_complete(out: &mut BytesMut, tag: &str) {
    let at = begin_message(out, b'C');
    put_cstr(out, tag);
    end_message(out, at);
}

pub fn parameter_status(out: &mut BytesMut, name: &str, value: &str) {
    let at = begin_message(out, b'S');
    put_cstr(out, name);
    put_cstr(out, value);
    end_message(out, at);
}

pub fn backend_key_data(out: &mut BytesMut, process_id: i32, secret_key: i32) {
    let at = begin_message(out, b'K');
    out.put_i32(process_id);
    out.put_i32(secret_key);
    end_message(out, at);
}

pub fn authentication(out: &mut BytesMut, code: i32, data: &[u8]) {
    let at = begin_message(out, b'R');
    out.put_i32(code);
    out.put_slice(data);
    end_message(out, at);
}

pub fn startup(out: &mut BytesMut, parameters: &[(&str, &str)]) {
    let at = out.len();
    out.put_i32(0);
    out.put_i32(PROTOCOL_V3);
    for (name, value) in parameters {
        put_cstr(out, name);
        put_cstr(out, value);
    }
    out.put_u8(0);
    let length = (out.len() - at) as i32;
    out[at..at + 4].copy_from_slice(&length.to_be_bytes());
}

pub fn ssl_request(out: &mut BytesMut) {
    out.put_i32(8);
    out.put_i32(SSL_REQUEST);
}

pub fn cancel_request(out: &mut BytesMut, process_id: i32, secret_key: i32) {
    out.put_i32(16);
    out.put_i32(CANCEL_REQUEST);
    out.put_i32(process_id);
    out.put_i32(secret_key);
}

pub fn password(out: &mut BytesMut, data: &[u8]) {
    let at = begin_message(out, b'p');
    out.put_slice(data);
    end_message(out, at);
}

/// An ErrorResponse.
pub fn error_response(out: &mut BytesMut, error: &ServerError) {
    error_fields(out, b'E', error);
}

/// A NoticeResponse (a warning of the coordinator's own).
pub fn notice_response(out: &mut BytesMut, notice: &ServerError) {
    error_fields(out, b'N', notice);
}

fn error_fields(out: &mut BytesMut, tag: u8, error: &ServerError) {
    let at = begin_message(out, tag);
    for (field, value) in error.fields() {
        out.put_u8(field);
        put_cstr(out, value);
    }
    out.put_u8(0);
    end_message(out, at);
}

/// The fields of an ErrorResponse the coordinator raises or inspects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    pub code: String,
    pub message: String,
    /// DETAIL, HINT and CONTEXT, when there are any (boxed: errors travel
    /// in Results, and most have none).
    extra: Option<Box<ErrorExtra>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ErrorExtra {
    detail: Option<String>,
    hint: Option<String>,
    context: Option<String>,
}

impl ServerError {
    pub fn new(code: &str, message: impl Into<String>) -> ServerError {
        ServerError {
            severity: "ERROR".into(),
            code: code.into(),
            message: message.into(),
            extra: None,
        }
    }

    pub fn warning(message: impl Into<String>) -> ServerError {
        ServerError {
            severity: "WARNING".into(),
            ..ServerError::new("01000", message)
        }
    }

    pub fn fatal(code: &str, message: impl Into<String>) -> ServerError {
        ServerError {
            severity: "FATAL".into(),
            ..ServerError::new(code, message)
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> ServerError {
        self.extra_mut().hint = Some(hint.into());
        self
    }

    pub fn with_code(mut self, code: &str) -> ServerError {
        self.code = code.into();
        self
    }

    fn extra_mut(&mut self) -> &mut ErrorExtra {
        self.extra.get_or_insert_with(Default::default)
    }

    /// Takes the CONTEXT out (to be rewritten).
    pub fn take_context(&mut self) -> Option<String> {
        self.extra.as_mut().and_then(|extra| extra.context.take())
    }

    pub fn with_context(mut self, context: impl Into<String>) -> ServerError {
        self.extra_mut().context = Some(context.into());
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> ServerError {
        self.extra_mut().detail = Some(detail.into());
        self
    }

    fn fields(&self) -> Vec<(u8, &str)> {
        let mut fields = vec![
            (b'S', self.severity.as_str()),
            (b'V', self.severity.as_str()),
            (b'C', self.code.as_str()),
            (b'M', self.message.as_str()),
        ];
        if let Some(extra) = &self.extra {
            for (field, value) in [
                (b'D', &extra.detail),
                (b'H', &extra.hint),
                (b'W', &extra.context),
            ] {
                if let Some(value) = value {
                    fields.push((field, value.as_str()));
                }
            }
        }
        fields
    }

    /// Reads the fields of an ErrorResponse body.
    pub fn parse(body: &[u8]) -> ServerError {
        let mut error = ServerError::new(sqlstate::INTERNAL_ERROR, "");
        let mut fields = body.split(|b| *b == 0);
        for field in fields.by_ref() {
            let Some((&kind, value)) = field.split_first() else {
                break;
            };
            let value = String::from_utf8_lossy(value).into_owned();
            match kind {
                b'S' => error.severity = value,
                b'C' => error.code = value,
                b'M' => error.message = value,
                b'D' => error.extra_mut().detail = Some(value),
                b'H' => error.extra_mut().hint = Some(value),
                b'W' => error.extra_mut().context = Some(value),
                _ => {}
            }
        }
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*): the same cases on
    /// every run, so a failure can be replayed.
    struct Cases(u64);

    impl Cases {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }

        /// `valid` with a few bytes changed, cut short or run on.
        fn mutated(&mut self, valid: &[u8]) -> Vec<u8> {
            let mut out = valid.to_vec();
            match self.below(4) {
                0 => {
                    for _ in 0..=self.below(4) {
                        if !out.is_empty() {
                            let at = self.below(out.len());
                            out[at] = self.next() as u8;
                        }
                    }
                }
                1 => out.truncate(self.below(out.len() + 1)),
                2 => {
                    let extra = self.below(16);
                    out.extend(self.bytes(extra));
                }
                _ => {
                    // A length field anywhere near the start.
                    if out.len() >= 5 {
                        let at = self.below(2);
                        let length = [0, 4, 5, i32::MAX, -1, 1 << 24][self.below(6)];
                        out[at..at + 4].copy_from_slice(&length.to_be_bytes());
                    }
                }
            }
            out
        }
    }

    /// Well-formed frontend messages of every kind the coordinator reads.
    fn every_message() -> BytesMut {
        let mut out = BytesMut::new();
        query(&mut out, "SELECT 1");
        parse(&mut out, "s1", "SELECT $1::int", &[23]);
        let mut bind = BytesMut::new();
        put_cstr(&mut bind, "");
        put_cstr(&mut bind, "s1");
        bind.put_i16(1);
        bind.put_i16(0);
        bind.put_i16(2);
        bind.put_i32(1);
        bind.put_u8(b'7');
        bind.put_i32(-1);
        bind.put_i16(1);
        bind.put_i16(1);
        out.extend_from_slice(&framed(b'B', &bind));
        describe(&mut out, b'S', "s1");
        execute(&mut out, "", 0);
        close(&mut out, b'P', "");
        out.extend_from_slice(&framed(b'd', b"1\t2\n"));
        out.extend_from_slice(&framed(b'c', b""));
        out.extend_from_slice(&framed(b'f', b"no\0"));
        out.extend_from_slice(&framed(b'F', &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]));
        password(&mut out, b"secret\0");
        flush(&mut out);
        sync(&mut out);
        out.extend_from_slice(&framed(b'X', b""));
        out
    }

    /// Every message `input` holds, decoded one after another as the
    /// session does, up to the first error or incomplete message.
    fn decode_all(input: &[u8], utf8_client: bool) -> Vec<Result<FrontendMessage, String>> {
        let mut buffer = BytesMut::from(input);
        let mut decoded = Vec::new();
        loop {
            match decode_frontend(&mut buffer, 1 << 20, utf8_client) {
                Ok(Some(message)) => decoded.push(Ok(message)),
                Ok(None) => break,
                Err(e) => {
                    decoded.push(Err(e.to_string()));
                    break;
                }
            }
        }
        decoded
    }

    #[test]
    fn parameter_description_frames() {
        let mut out = BytesMut::new();
        parameter_description(&mut out, &[]);
        assert_eq!(&out[..], &[b't', 0, 0, 0, 6, 0, 0]);
        out.clear();
        parameter_description(&mut out, &[23, 25]);
        assert_eq!(
            &out[..],
            &[b't', 0, 0, 0, 14, 0, 2, 0, 0, 0, 23, 0, 0, 0, 25]
        );
    }

    #[test]
    fn the_decoders_refuse_any_bytes_without_panicking() {
        let mut cases = Cases(0x9e37_79b9_7f4a_7c15);
        let mut startup = BytesMut::new();
        super::startup(
            &mut startup,
            &[("user", "app"), ("database", "db"), ("options", "-c a=b")],
        );
        let mut cancel = BytesMut::new();
        cancel_request(&mut cancel, 7, 9);
        let messages = every_message();
        for round in 0..20_000 {
            let input = match round % 4 {
                0 => {
                    let n = cases.below(64);
                    cases.bytes(n)
                }
                1 => cases.mutated(&startup),
                2 => cases.mutated(&cancel),
                _ => cases.mutated(&messages),
            };
            let mut buffer = BytesMut::from(&input[..]);
            match decode_startup(&mut buffer, 1 << 20) {
                // What it took is gone from the buffer, nothing more.
                Ok(Some(_)) => assert!(buffer.len() < input.len()),
                Ok(None) => assert_eq!(buffer.len(), input.len()),
                Err(_) => {}
            }
            let decoded = decode_all(&input, round % 2 == 0);
            assert!(decoded.len() <= input.len() / 5 + 1);
        }
    }

    #[test]
    fn messages_decode_the_same_however_they_arrive() {
        let messages = every_message();
        let whole = decode_all(&messages, true);
        assert_eq!(whole.len(), 14);
        assert!(whole.iter().all(Result::is_ok));
        let mut cases = Cases(42);
        for _ in 0..2_000 {
            // Arriving in pieces: each piece appended, decoded as far as it goes.
            let mut buffer = BytesMut::new();
            let mut decoded = Vec::new();
            let mut at = 0;
            while at < messages.len() {
                let piece = 1 + cases.below(40);
                let end = (at + piece).min(messages.len());
                buffer.extend_from_slice(&messages[at..end]);
                at = end;
                while let Some(message) = decode_frontend(&mut buffer, 1 << 20, true).unwrap() {
                    decoded.push(format!("{message:?}"));
                }
            }
            let expected: Vec<String> = whole
                .iter()
                .map(|m| format!("{:?}", m.as_ref().unwrap()))
                .collect();
            assert_eq!(decoded, expected);
            assert!(buffer.is_empty());
        }
    }

    #[test]
    fn an_announced_length_reserves_little_ahead() {
        let mut buffer = BytesMut::from(&b"Q\x04\x00\x00\x00SELECT"[..]);
        assert!(split_message(&mut buffer, 1 << 30).unwrap().is_none());
        assert!(buffer.capacity() <= RESERVE_AHEAD + 64);
    }

    fn framed(tag: u8, body: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        let at = begin_message(&mut out, tag);
        out.put_slice(body);
        end_message(&mut out, at);
        out
    }

    #[test]
    fn client_text_keeps_every_byte() {
        let written = |text: &str| {
            let mut out = BytesMut::new();
            put_cstr(&mut out, text);
            out.to_vec()
        };
        let latin9 = b"SELECT '\xe9\xa4'";
        let text = client_text(latin9, false);
        assert!(has_client_bytes(&text));
        assert_eq!(written(&text), [&latin9[..], &[0]].concat());
        // UTF-8 of a UTF8 client stays as it is.
        let utf8 = "SELECT 'é€'";
        assert_eq!(client_text(utf8.as_bytes(), true), utf8);
        assert!(!has_client_bytes(utf8));
        // Bytes a UTF8 client got wrong reach the server unchanged (it says
        // why they are wrong), and so does a private-use character that
        // looks like a stand-in.
        for bytes in [&b"SELECT '\xff'"[..], "SELECT '\u{f790}é'".as_bytes()] {
            let text = client_text(bytes, true);
            assert!(has_client_bytes(&text));
            assert_eq!(written(&text), [bytes, &[0]].concat());
        }
        // A non-UTF8 client's valid UTF-8 is still taken byte for byte.
        assert!(has_client_bytes(&client_text(utf8.as_bytes(), false)));
    }

    #[test]
    fn bind_round_trips() {
        let bind = Bind {
            portal: "p".into(),
            statement: "s".into(),
            parameter_formats: vec![1],
            parameters: vec![Some(Bytes::from_static(b"\0\0\0\x2a")), None],
            result_formats: vec![0, 1],
        };
        let mut out = BytesMut::new();
        bind.encode("s", &mut out);
        let decoded = decode_frontend(&mut out, 1 << 20, true).unwrap().unwrap();
        assert_eq!(decoded, FrontendMessage::Bind(bind));
        assert!(out.is_empty());
    }

    #[test]
    fn partial_messages_wait_for_more() {
        let mut whole = BytesMut::new();
        query(&mut whole, "SELECT 1");
        for cut in 0..whole.len() {
            let mut part = BytesMut::from(&whole[..cut]);
            assert_eq!(decode_frontend(&mut part, 1 << 20, true), Ok(None));
        }
    }

    #[test]
    fn oversized_and_malformed_messages_are_errors() {
        let mut big = BytesMut::from(&[b'Q', 0x10, 0, 0, 0][..]);
        assert!(matches!(
            decode_frontend(&mut big, 1 << 20, true),
            Err(ProtocolError::TooLarge(..))
        ));
        let mut short = BytesMut::from(&[b'Q', 0, 0, 0, 2][..]);
        assert_eq!(
            decode_frontend(&mut short, 1 << 20, true),
            Err(ProtocolError::BadLength(2))
        );
        let mut unterminated = framed(b'Q', b"SELECT 1");
        assert_eq!(
            decode_frontend(&mut unterminated, 1 << 20, true),
            Err(ProtocolError::Malformed("Query"))
        );
        let mut trailing = framed(b'S', b"x");
        assert_eq!(
            decode_frontend(&mut trailing, 1 << 20, true),
            Err(ProtocolError::Malformed("Sync"))
        );
        let mut bad_bind = framed(b'B', b"\0\0\0\0\0\x01\0\0\0\x09ab\0\0");
        assert_eq!(
            decode_frontend(&mut bad_bind, 1 << 20, true),
            Err(ProtocolError::Malformed("Bind"))
        );
    }

    #[test]
    fn startup_packets() {
        let mut out = BytesMut::new();
        startup(&mut out, &[("user", "alice"), ("database", "shop")]);
        assert_eq!(
            decode_startup(&mut out, 1 << 20),
            Ok(Some(StartupRequest::Startup {
                parameters: vec![
                    ("user".into(), "alice".into()),
                    ("database".into(), "shop".into())
                ]
            }))
        );
        let mut out = BytesMut::new();
        cancel_request(&mut out, 7, 9);
        assert_eq!(
            decode_startup(&mut out, 1 << 20),
            Ok(Some(StartupRequest::Cancel {
                process_id: 7,
                secret_key: 9
            }))
        );
        let mut huge = BytesMut::from(&[0x7f, 0, 0, 0, 0, 3, 0, 0][..]);
        assert!(decode_startup(&mut huge, 1 << 20).is_err());
    }

    #[test]
    fn error_fields_round_trip() {
        let error = ServerError::new("PS001", "wrong shard").with_hint("retry");
        let mut out = BytesMut::new();
        error_response(&mut out, &error);
        let (tag, body) = split_message(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(tag, b'E');
        assert_eq!(ServerError::parse(&body), error);
    }

    proptest::proptest! {
        // The decoder must never panic, whatever the bytes.
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut buffer = BytesMut::from(&bytes[..]);
            let _ = decode_startup(&mut buffer.clone(), 1 << 16);
            while let Ok(Some(_)) = decode_frontend(&mut buffer, 1 << 16, true) {}
        }

        #[test]
        fn typed_garbage_never_panics(tag in proptest::prelude::any::<u8>(), body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = parse_frontend(tag, Bytes::from(body), tag % 2 == 0);
        }
    }
}
