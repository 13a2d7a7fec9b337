//! `engine`: the step loop, sampling, request streams, metrics and the embedding API.
