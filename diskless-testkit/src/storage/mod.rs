//! Conformance suite, fault injection and an in-process S3 server for `ObjectStorage`.
