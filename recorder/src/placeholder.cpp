namespace cachealloc {}
