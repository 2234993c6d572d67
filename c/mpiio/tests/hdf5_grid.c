/* Parallel HDF5 from C, unmodified: a 16 x 4p int dataset, rank r writing the column block
 * 4r..4r+3 (a strided hyperslab: HDF5 sets a noncontiguous file view) collectively, then
 * reading the row block 16r/p.. collectively and checking it. Value at (i, j) is i*1000+j.
 * The file is checked afterwards with the local tools.
 *   mpirun -np 2 ./hdf5_grid FILE */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define ROWS 16

static void check(herr_t rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "hdf5_grid: %s failed\n", what);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int r, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 2) {
        fprintf(stderr, "usage: hdf5_grid FILE\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    hsize_t cols = 4 * (hsize_t)p, dims[2] = {ROWS, cols};
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    check(H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL), "H5Pset_fapl_mpio");
    hid_t file = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    check(file, "H5Fcreate");
    hid_t space = H5Screate_simple(2, dims, NULL);
    hid_t dset = H5Dcreate2(file, "grid", H5T_NATIVE_INT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    check(dset, "H5Dcreate2");
    hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
    check(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");

    int block[ROWS][4];
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < 4; j++)
            block[i][j] = i * 1000 + 4 * r + j;
    hsize_t start[2] = {0, 4 * (hsize_t)r}, count[2] = {ROWS, 4};
    check(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL), "select");
    hid_t mem = H5Screate_simple(2, count, NULL);
    check(H5Dwrite(dset, H5T_NATIVE_INT, mem, space, dxpl, block), "H5Dwrite");
    H5Sclose(mem);
    check(H5Fflush(file, H5F_SCOPE_GLOBAL), "H5Fflush");

    /* Read the row block back: rows 16r/p .. 16(r+1)/p - 1, all columns. */
    hsize_t r0 = ROWS * (hsize_t)r / p, nr = ROWS * (hsize_t)(r + 1) / p - r0;
    hsize_t rstart[2] = {r0, 0}, rcount[2] = {nr, cols};
    int *rows = calloc(nr * cols, sizeof *rows);
    check(H5Sselect_hyperslab(space, H5S_SELECT_SET, rstart, NULL, rcount, NULL), "select rows");
    mem = H5Screate_simple(2, rcount, NULL);
    check(H5Dread(dset, H5T_NATIVE_INT, mem, space, dxpl, rows), "H5Dread");
    int bad = 0;
    for (hsize_t i = 0; i < nr; i++)
        for (hsize_t j = 0; j < cols; j++)
            if (rows[i * cols + j] != (int)((r0 + i) * 1000 + j))
                bad = 1;
    free(rows);
    H5Sclose(mem);
    H5Pclose(dxpl);
    H5Dclose(dset);
    H5Sclose(space);
    H5Fclose(file);
    H5Pclose(fapl);
    int any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any && r == 0)
        fprintf(stderr, "hdf5_grid: the collective read returned other ints\n");
    if (!any && r == 0)
        printf("hdf5_grid: ok, %d ranks\n", p);
    MPI_Finalize();
    return any ? 5 : 0;
}
