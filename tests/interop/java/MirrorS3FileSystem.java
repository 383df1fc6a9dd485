package iceberg_sink.tests;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.util.EnumSet;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * A read-only Hadoop FileSystem for the test reader: {@code s3://bucket/key} (and {@code s3a://})
 * is served from the local file {@code <root>/bucket/key}, where {@code <root>} is the
 * configuration value {@value #ROOT_KEY}.
 *
 * <p>The Java reader has no S3 client (no hadoop-aws or AWS SDK jars come from the package
 * registries), so tests copy a table's objects from the S3 server into {@code <root>} byte for byte
 * and let Iceberg Java resolve every unmodified {@code s3://} path in metadata, manifest lists and
 * manifests through this class. Paths are never rewritten; a file missing from the copy fails the
 * read as it would on S3. Writes are refused: a reader must not change the copy it checks.
 */
public class MirrorS3FileSystem extends RawLocalFileSystem {
  public static final String ROOT_KEY = "iceberg-sink.mirror-s3.root";

  private static final URI LOCAL = URI.create("file:///");

  private URI uri;
  private File bucketDir;

  @Override
  public void initialize(URI name, Configuration conf) throws IOException {
    super.initialize(name, conf);
    String root = conf.get(ROOT_KEY);
    if (root == null || root.isEmpty()) {
      throw new IOException(
          "MirrorS3FileSystem needs the mirror directory in the Hadoop configuration key " + ROOT_KEY);
    }
    String bucket = name.getAuthority();
    if (bucket == null || bucket.isEmpty()) {
      throw new IOException("MirrorS3FileSystem needs a bucket in the URI, got " + name);
    }
    this.uri = URI.create(name.getScheme() + "://" + bucket + "/");
    this.bucketDir = new File(root, bucket);
    setWorkingDirectory(new Path(this.uri));
  }

  @Override
  public URI getUri() {
    // RawLocalFileSystem's constructor qualifies its working directory before initialize() runs.
    return uri == null ? LOCAL : uri;
  }

  @Override
  public String getScheme() {
    return uri == null ? "s3" : uri.getScheme();
  }

  @Override
  public File pathToFile(Path path) {
    checkPath(path);
    Path absolute = path.isAbsolute() ? path : new Path(getWorkingDirectory(), path);
    return new File(bucketDir, absolute.toUri().getPath());
  }

  @Override
  public FileStatus getFileStatus(Path f) throws IOException {
    FileStatus local = super.getFileStatus(f);
    // RawLocalFileSystem names the status after the local file; report the s3:// path asked for.
    return new FileStatus(
        local.getLen(),
        local.isDirectory(),
        1,
        local.getBlockSize(),
        local.getModificationTime(),
        makeQualified(f));
  }

  private IOException readOnly(Path f) {
    return new IOException("MirrorS3FileSystem is a read-only copy for tests; refusing to write " + f);
  }

  @Override
  public FSDataOutputStream create(
      Path f, FsPermission permission, boolean overwrite, int bufferSize, short replication, long blockSize,
      Progressable progress) throws IOException {
    throw readOnly(f);
  }

  @Override
  public FSDataOutputStream create(
      Path f, boolean overwrite, int bufferSize, short replication, long blockSize, Progressable progress)
      throws IOException {
    throw readOnly(f);
  }

  @Override
  public FSDataOutputStream createNonRecursive(
      Path f, FsPermission permission, EnumSet<CreateFlag> flags, int bufferSize, short replication, long blockSize,
      Progressable progress) throws IOException {
    throw readOnly(f);
  }

  @Override
  public FSDataOutputStream createNonRecursive(
      Path f, FsPermission permission, boolean overwrite, int bufferSize, short replication, long blockSize,
      Progressable progress) throws IOException {
    throw readOnly(f);
  }

  @Override
  public FSDataOutputStream append(Path f, int bufferSize, Progressable progress) throws IOException {
    throw readOnly(f);
  }

  @Override
  public boolean truncate(Path f, long newLength) throws IOException {
    throw readOnly(f);
  }

  @Override
  public boolean delete(Path p, boolean recursive) throws IOException {
    throw readOnly(p);
  }

  @Override
  public boolean rename(Path src, Path dst) throws IOException {
    throw readOnly(src);
  }

  @Override
  public boolean mkdirs(Path f) throws IOException {
    throw readOnly(f);
  }

  @Override
  public boolean mkdirs(Path f, FsPermission permission) throws IOException {
    throw readOnly(f);
  }
}
