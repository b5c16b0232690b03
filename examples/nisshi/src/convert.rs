//! Between Nisshi's types (tansu-sans-io, tansu-storage) and the library's.

use bytes::Bytes;
use diskless_coordinator::{CoordinatorError, ErrorCode as DisklessCode};
use tansu_sans_io::ErrorCode;
use tansu_sans_io::record::deflated;
use tansu_storage::Error;

/// The Kafka error code of the library's `code`, as Nisshi's enum (Kafka's own numbers on both
/// sides; a number Nisshi does not know becomes `UNKNOWN_SERVER_ERROR`).
pub(crate) fn code(code: DisklessCode) -> ErrorCode {
    ErrorCode::try_from(code.code()).unwrap_or(ErrorCode::UnknownServerError)
}

/// A library error as Nisshi's storage error: its Kafka error code.
pub(crate) fn api_error(e: &CoordinatorError) -> Error {
    Error::Api(code(e.error_code()))
}

/// The wire bytes of a batch Nisshi decoded (its fields and record bytes, written back unchanged).
pub(crate) fn batch_bytes(batch: deflated::Batch) -> Bytes {
    Bytes::from(batch)
}

/// The record batches in `records` (whole batches, one after another, as the fetcher returns
/// them), as Nisshi's batches. A trailing partial batch is dropped, as a Kafka client drops one.
pub(crate) fn batches(records: &Bytes) -> Result<Vec<deflated::Batch>, Error> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while records.len().saturating_sub(at) >= 12 {
        let length = i32::from_be_bytes([
            records[at + 8],
            records[at + 9],
            records[at + 10],
            records[at + 11],
        ]);
        let Ok(length) = usize::try_from(length) else {
            return Err(Error::Message(format!(
                "a stored batch has a negative length {length}"
            )));
        };
        let end = at + 12 + length;
        if end > records.len() {
            break;
        }
        out.push(deflated::Batch::try_from(records.slice(at..end))?);
        at = end;
    }
    Ok(out)
}
