//! The PostgreSQL batch coordinator (implementation in progress).
