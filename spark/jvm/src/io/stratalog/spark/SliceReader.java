package io.stratalog.spark;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32C;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The rows of one slice, read as {@code stratalog.spark.reading} reads it: batches walked
 * by their headers (framing and offsets checked for every batch, skipped or not), whole
 * batches skipped by offset, control flag, aborted transaction or as wholly older than a
 * startingTimestamp not yet reached (after the first record at or past it, every later
 * record counts whatever its time, as from Kafka's offsetsForTimes position), every
 * batch taken has its CRC-32C checked before its records are decoded, and the slice's
 * offset and timestamp bounds applied per record. A WAL object collected after planning
 * is re-planned through the Python planner from the segments that now hold its offsets,
 * continuing after the last offset returned.
 */
final class SliceReader implements PartitionReader<InternalRow> {
  private static final int HEADER_SIZE = 61;
  private static final int MIN_BATCH_LENGTH = HEADER_SIZE - 12;

  private final Rows rows;
  private final Planner planner;
  private final Map<String, String> options;
  private final Deque<Slice> pieces = new ArrayDeque<>();
  private final UTF8String topic;

  // Across pieces: the seek not yet reached, whether the stop was, the last offset returned.
  private Long seeking;
  private boolean stopped;
  private long lastReturned;

  // The piece being walked.
  private Slice piece;
  private ObjectSource source;
  private Window window;
  private long position;
  private long previousEnd;

  // The batch whose records are being decoded.
  private byte[] rec;
  private int recPos;
  private int recEnd;
  private int recLeft;
  private long batchPosition;
  private long baseOffset;
  private long baseTimestamp;
  private long maxTimestamp;
  private boolean logAppendTime;

  private InternalRow current;
  /** The last decompressed section's array, reused for the next. */
  private byte[] scratch;

  SliceReader(Slice slice, Rows rows, Planner planner, Map<String, String> options) {
    this.rows = rows;
    this.planner = planner;
    this.options = options;
    this.topic = UTF8String.fromString(slice.topic);
    this.seeking = slice.seekTs;
    this.lastReturned = slice.startOffset - 1;
    pieces.add(slice);
  }

  @Override
  public boolean next() {
    while (!stopped) {
      if (recLeft > 0) {
        InternalRow row = nextRecord();
        if (row != null) {
          current = row;
          return true;
        }
        continue;
      }
      if (rec != null && recPos != recEnd) {
        throw corruptBatch("records end at byte " + recPos + " of a " + recEnd + "-byte section");
      }
      rec = null;
      if (piece == null && !nextPiece()) {
        return false;
      }
      try {
        if (!nextBatch()) {
          endPiece();
        }
      } catch (ObjectSource.Gone gone) {
        Slice lost = piece;
        endPiece();
        whenGone(lost, gone.getMessage());
      }
    }
    return false;
  }

  @Override
  public InternalRow get() {
    return current;
  }

  @Override
  public void close() {
    endPiece();
  }

  private boolean nextPiece() {
    piece = pieces.poll();
    if (piece == null) {
      return false;
    }
    source = ObjectSource.open(piece.key, piece.location);
    window = new Window(source, piece.byteEnd, piece.chunkBytes);
    position = piece.byteStart;
    previousEnd = piece.baseOffset;
    return true;
  }

  private void endPiece() {
    if (source != null) {
      source.close();
    }
    source = null;
    piece = null;
    rec = null;
    recLeft = 0;
  }

  private void whenGone(Slice lost, String key) {
    if (lost.replan != null) {  // a WAL range: its offsets are in segments now
      if (lastReturned + 1 >= lost.endOffset) {
        return;
      }
      // Pieces re-planned from segments go first, before anything else still queued.
      List<Slice> again = planner.replan(options, lost, lastReturned, seeking);
      for (int i = again.size() - 1; i >= 0; i--) {
        pieces.addFirst(again.get(i));
      }
      return;
    }
    if (lost.failOnDataLoss) {
      throw new IllegalStateException("DataLoss: " + lost.topic + "-" + lost.partition + ": segment object "
          + key + " is gone (retention or a compaction swap removed it after the query was planned); "
          + "run the query again, or set failOnDataLoss=false to skip missing segments");
    }
  }

  /** Reads the next batch header; false at the end of the piece. */
  private boolean nextBatch() {
    long end = piece.byteEnd;
    if (position >= end) {
      return false;
    }
    if (position + HEADER_SIZE > end) {
      throw corrupt(position, (end - position) + " trailing bytes at " + position + " are not a batch");
    }
    byte[] buf = window.bytes(position, HEADER_SIZE);
    int h = window.offset;
    ByteBuffer bb = ByteBuffer.wrap(buf);
    long base = bb.getLong(h);
    int batchLength = bb.getInt(h + 8);
    byte magic = buf[h + 16];
    if (magic != 2) {
      throw corrupt(position, "batch has magic " + magic + ", expected 2");
    }
    if (batchLength < MIN_BATCH_LENGTH) {
      throw corrupt(position, "batchLength " + batchLength + " is below the minimum " + MIN_BATCH_LENGTH);
    }
    long crc = bb.getInt(h + 17) & 0xffffffffL;
    short attributes = bb.getShort(h + 21);
    int lastOffsetDelta = bb.getInt(h + 23);
    long firstTimestamp = bb.getLong(h + 27);
    long maxTs = bb.getLong(h + 35);
    long producerId = bb.getLong(h + 43);
    int count = bb.getInt(h + 57);
    long last = base + lastOffsetDelta;
    long size = batchLength + 12L;
    if (base < previousEnd || last > piece.lastOffset || lastOffsetDelta < 0) {
      throw corrupt(position, "batch offsets " + base + ".." + last + " do not follow " + (previousEnd - 1)
          + " within segment " + piece.baseOffset + ".." + piece.lastOffset);
    }
    if (position + size > end) {
      throw corrupt(position, "batch at byte " + position + " runs past the end (" + end + ")");
    }
    previousEnd = last + 1;
    boolean transactional = (attributes & 0x10) != 0;
    boolean control = (attributes & 0x20) != 0;
    if (base >= piece.endOffset) {
      position = end;
      return false;
    }
    long here = position;
    position += size;
    if (last < piece.startOffset || control || (seeking != null && maxTs < seeking)) {
      return true;  // (or wholly before the position)
    }
    if (transactional && aborted(producerId, base)) {
      seeking = null;  // if it held the position, it passed it: every later record counts
      return true;
    }
    buf = window.bytes(here, (int) size);
    int at = window.offset;
    CRC32C check = new CRC32C();
    check.update(buf, at + 21, (int) size - 21);
    batchPosition = here;
    baseOffset = base;
    if (check.getValue() != crc) {
      throw corruptBatch("CRC mismatch");
    }
    if (count < 0) {
      throw corruptBatch("negative records count " + count);
    }
    int codec = attributes & 0x07;
    if (codec == Codecs.NONE) {
      rec = buf;
      recPos = at + HEADER_SIZE;
      recEnd = at + (int) size;
    } else {
      Codecs.Section plain;
      try {
        plain = Codecs.decompress(codec, buf, at + HEADER_SIZE, (int) size - HEADER_SIZE,
            piece.maxDecompressedBytes, scratch);
      } catch (BadData e) {
        throw corruptBatch(e.getMessage());
      }
      scratch = plain.bytes;  // the next batch decompresses into it again
      rec = plain.bytes;
      recPos = 0;
      recEnd = plain.length;
    }
    recLeft = count;
    baseTimestamp = firstTimestamp;
    maxTimestamp = maxTs;
    logAppendTime = (attributes & 0x08) != 0;
    return true;
  }

  private boolean aborted(long producerId, long base) {
    for (long[] a : piece.aborted) {
      if (a[0] == producerId && a[1] <= base && base <= a[2]) {
        return true;
      }
    }
    return false;
  }

  /** Decodes one record; its row, or null when the bounds leave it out. */
  private InternalRow nextRecord() {
    int length = varint(recEnd);
    if (length < 0 || length > recEnd - recPos) {
      throw corruptBatch("record claims " + length + " bytes, " + (recEnd - recPos) + " remain");
    }
    int end = recPos + length;
    recLeft--;
    if (recPos >= end) {
      throw corruptBatch("empty record");
    }
    recPos++;  // attributes: unused by format v2
    long tsDelta = varlong(end);
    int offsetDelta = varint(end);
    int keyLen = varint(end);
    int keyAt = recPos;
    if (keyLen < -1 || keyLen > end - recPos) {
      throw corruptBatch("key length " + keyLen + " does not fit its record");
    }
    recPos += Math.max(keyLen, 0);
    int valueLen = varint(end);
    int valueAt = recPos;
    if (valueLen < -1 || valueLen > end - recPos) {
      throw corruptBatch("value length " + valueLen + " does not fit its record");
    }
    recPos += Math.max(valueLen, 0);
    int headerCount = varint(end);
    if (headerCount < 0) {
      throw corruptBatch("negative header count " + headerCount);
    }
    GenericArrayData headers = headerCount == 0 ? null : headers(headerCount, end, rows.wantsHeaders);
    if (recPos != end) {
      throw corruptBatch("record fields end at " + recPos + ", its length says " + end);
    }
    if (offsetDelta < 0) {
      throw corruptBatch("negative offset delta " + offsetDelta);
    }
    long offset = baseOffset + offsetDelta;
    long timestamp = logAppendTime ? maxTimestamp : baseTimestamp + tsDelta;
    boolean wanted = offset >= piece.startOffset && offset < piece.endOffset;
    if (seeking != null) {
      if (!wanted || timestamp < seeking) {
        return null;
      }
      seeking = null;  // the position: every later record counts whatever its time
    }
    if (piece.stopTs != null && timestamp >= piece.stopTs) {
      stopped = true;
      return null;
    }
    if (!wanted) {
      return null;
    }
    lastReturned = offset;
    return rows.row(topic, piece.partition, rec, keyAt, keyLen, valueAt, valueLen, offset, timestamp,
        logAppendTime ? 1 : 0, headers);
  }

  /** Reads (and checks) a record's headers; their column value only if {@code keep}. */
  private GenericArrayData headers(int count, int end, boolean keep) {
    Object[] pairs = keep ? new Object[count] : null;
    for (int i = 0; i < count; i++) {
      int keyLen = varint(end);
      if (keyLen < 0 || keyLen > end - recPos) {
        throw corruptBatch("header key length " + keyLen + " does not fit its record");
      }
      String name;
      try {
        name = StandardCharsets.UTF_8.newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT)
            .decode(ByteBuffer.wrap(rec, recPos, keyLen)).toString();
      } catch (CharacterCodingException e) {
        throw corruptBatch("header key is not UTF-8");
      }
      recPos += keyLen;
      int valueLen = varint(end);
      if (valueLen < -1 || valueLen > end - recPos) {
        throw corruptBatch("header value length " + valueLen + " does not fit its record");
      }
      if (keep) {
        byte[] value = valueLen < 0 ? null : Arrays.copyOfRange(rec, recPos, recPos + valueLen);
        pairs[i] = Rows.header(UTF8String.fromString(name), value);
      }
      recPos += Math.max(valueLen, 0);
    }
    return keep ? Rows.headers(pairs) : null;
  }

  private int varint(int limit) {
    int raw = 0;
    for (int shift = 0; ; shift += 7) {
      if (shift > 28) {
        throw corruptBatch("varint longer than 5 bytes");
      }
      if (recPos >= limit) {
        throw corruptBatch("varint runs past its record");
      }
      byte b = rec[recPos++];
      raw |= (b & 0x7f) << shift;
      if (b >= 0) {
        return (raw >>> 1) ^ -(raw & 1);
      }
    }
  }

  private long varlong(int limit) {
    long raw = 0;
    for (int shift = 0; ; shift += 7) {
      if (shift > 63) {
        throw corruptBatch("varlong longer than 10 bytes");
      }
      if (recPos >= limit) {
        throw corruptBatch("varint runs past its record");
      }
      byte b = rec[recPos++];
      raw |= (long) (b & 0x7f) << shift;
      if (b >= 0) {
        return (raw >>> 1) ^ -(raw & 1);
      }
    }
  }

  private IllegalStateException corrupt(long at, String what) {
    return new IllegalStateException("CorruptSegment: " + piece.key + " at byte " + at + ": " + what);
  }

  private IllegalStateException corruptBatch(String what) {
    return new IllegalStateException("CorruptSegment: " + piece.key + " batch at byte " + batchPosition
        + " (offset " + baseOffset + "): " + what);
  }

  /**
   * The object's bytes around the walk's position, fetched {@code chunk} bytes at a time
   * into two arrays used in turn (arrays of megabytes are costly to allocate on the
   * JVM's heap; a batch handed out from one is decoded before the other is refilled).
   */
  final class Window {
    private final ObjectSource source;
    private final long end;
    private final int chunk;
    private byte[] buf = new byte[0];
    private int length;
    private byte[] spare;
    private long start;
    /** Where the bytes last asked for begin in the returned array. */
    int offset;

    Window(ObjectSource source, long end, int chunk) {
      this.source = source;
      this.end = end;
      this.chunk = chunk;
    }

    byte[] bytes(long at, int wanted) {
      long off = at - start;
      if (off < 0 || off + wanted > length) {
        // The part of the current bytes still wanted moves to the front of the other
        // array and the object's next bytes are read in after it.
        int keep = off >= 0 && off < length ? length - (int) off : 0;
        long from = at + keep;
        long to = Math.min(end, Math.max(at + wanted, from + chunk));
        int need = keep + (int) (to - from);
        byte[] next = spare != null && spare.length >= need ? spare : new byte[need];
        if (keep > 0) {
          System.arraycopy(buf, (int) off, next, 0, keep);
        }
        int got = source.readInto(from, next, keep, (int) (to - from));
        if (got != to - from) {
          throw corrupt(from + got, "object ends at " + (from + got) + ", the manifest says " + end);
        }
        spare = buf;
        buf = next;
        length = need;
        start = at;
        off = 0;
      }
      offset = (int) off;
      return buf;
    }
  }
}
