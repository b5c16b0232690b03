//! What every request handler shares, below the handlers and the server that dispatches to them:
//! the request's context ([`Ctx`]), the encoding of a response frame ([`encode_response`]) and an
//! error answer ([`ApiError`]).

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::{Encodable, HeaderVersion};

use crate::codes;

/// What a handler knows about the request it serves.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    /// The logical broker (node id) the connection came to.
    pub node: i32,
    pub peer: SocketAddr,
    pub api_key: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
    pub client_id: String,
}

/// Encodes a response frame: size, header (the version the API and version call for), body.
pub(crate) fn encode_response<R: Encodable + HeaderVersion>(
    ctx: &Ctx,
    version: i16,
    body: &R,
) -> Result<Bytes, String> {
    let mut header = ResponseHeader::default();
    header.correlation_id = ctx.correlation_id;
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    header
        .encode(&mut buf, R::header_version(version))
        .and_then(|()| body.encode(&mut buf, version))
        .map_err(|e| {
            format!(
                "cannot encode the {:?} v{version} response: {e:#}",
                ctx.api_key
            )
        })?;
    let len = i32::try_from(buf.len() - 4).map_err(|_| "response too large".to_string())?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// An error answer: a Kafka error code and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub code: i16,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(code: i16, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }

    /// `INVALID_CONFIG` with `message`.
    pub(crate) fn invalid_config(message: impl Into<String>) -> ApiError {
        ApiError::new(codes::INVALID_CONFIG, message)
    }
}
