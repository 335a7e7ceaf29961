package io.stratalog.spark;

/** Bytes that are not a well-formed batch; the reader names the object and position. */
final class BadData extends RuntimeException {
  private static final long serialVersionUID = 1L;

  BadData(String message) {
    super(message);
  }
}
