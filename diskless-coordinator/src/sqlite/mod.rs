//! The SQLite batch coordinator (implementation in progress).
