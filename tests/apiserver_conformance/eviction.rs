//! Facts of section(s): see the module's tests.
