namespace cachealloc::analyzer {}
