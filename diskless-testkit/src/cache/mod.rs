//! Conformance suite for `LocalCache` implementations.
