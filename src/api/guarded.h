// No exception crosses the public API: entry points run their body through guarded().
#pragma once
#include <exception>
#include <new>
#include <string>

#include "flashkda/flashkda.h"

namespace flashkda::api {

// Runs `fn` (returning Status) and turns any exception into kInternal.
template <typename Fn>
inline Status guarded(Backend backend, const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return {StatusCode::kInternal, std::string(what) + " (" + to_string(backend) + "): out of host memory"};
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, std::string(what) + " (" + to_string(backend) + "): " + e.what()};
  } catch (...) {
    return {StatusCode::kInternal, std::string(what) + " (" + to_string(backend) + "): unknown exception"};
  }
}

}  // namespace flashkda::api
