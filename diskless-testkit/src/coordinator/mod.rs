//! The in-memory reference coordinator, its conformance suite and generators.
