//! The Inkling text model: config, weights, CPU and GPU forward.
